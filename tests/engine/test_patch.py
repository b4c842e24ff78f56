"""trl_compat._engine.patch: a Patch is a fixed declaration with explicit fields; PatchStatus is
one line of the report."""

import sys
import uuid

from trl_compat._engine import Patch, PatchStatus, needed

import pytest

FIELDS = dict(
    id="test-decl", summary="s", upstream="u", trigger="x.mod", must_exist="Cls.meth", requires={"trl": ">=1"}, changes=("Cls.meth",)
)


def test_a_patch_is_fixed_once_declared_and_replace_gives_a_changed_copy():
    patch = Patch(**dict(FIELDS, changes=["Cls.meth"]), impl="trl_compat.no_such_impl")
    with pytest.raises(AttributeError, match=r"fixed once declared; use \.replace\(summary=\.\.\.\)"):
        patch.summary = "other"
    with pytest.raises(AttributeError):
        patch.new_field = 1
    copy = patch.replace(summary="other")
    assert (copy.summary, patch.summary) == ("other", "s")
    assert copy.changes == ("Cls.meth",) and copy.impl == patch.impl
    assert copy == patch.replace(summary="other") and copy != patch


def test_fields_are_copied_not_shared():
    requires = {"trl": ">=1"}
    patch = Patch(**dict(FIELDS, requires=requires))
    requires["trl"] = ">=2"
    assert patch.requires == {"trl": ">=1"} and patch.witnesses == {} and patch.changes == ("Cls.meth",)


def test_unknown_or_missing_fields_are_a_type_error():
    with pytest.raises(TypeError):
        Patch(**FIELDS, module="x.mod")
    with pytest.raises(TypeError):
        Patch(id="test-decl", summary="s")


def test_a_patch_that_declares_no_changes_is_refused():
    with pytest.raises(ValueError, match="declares no changes"):
        Patch(**dict(FIELDS, changes=()))


def test_impl_is_imported_only_when_the_probe_is_called(tmp_path, monkeypatch):
    name = "tcimpl_" + uuid.uuid4().hex[:8]
    (tmp_path / f"{name}.py").write_text(
        "from trl_compat._engine import needed\n"
        "def probe(module):\n    return needed('from impl')\n"
        "def apply(module, patcher):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = Patch(**FIELDS, impl=name)
    assert "imported when called" in repr(patch.probe) and name not in sys.modules
    try:
        assert patch.probe(None) == needed("from impl") and name in sys.modules
        assert patch == Patch(**FIELDS, impl=name)
        forced = patch.replace(probe=lambda module: needed("forced"))
        # a probe given as a function: the copy no longer uses impl; its apply is impl's own function
        assert forced.impl == "" and forced.apply is sys.modules[name].apply
        assert forced.probe(None) == needed("forced")
    finally:
        sys.modules.pop(name, None)


def test_repr_and_equality_name_every_field():
    patch = Patch(**FIELDS)
    assert repr(patch).startswith(
        "Patch(id='test-decl', kind='fix', summary='s', symptom='', upstream='u', fixed_in=None, trigger='x.mod'"
    )
    assert patch == Patch(**FIELDS) and patch != Patch(**dict(FIELDS, must_exist="Other"))
    with pytest.raises(TypeError):
        hash(patch)


def test_patch_status_as_dict_is_the_report_row():
    record = PatchStatus(id="p", status="applied", reason="r", versions={"trl": "1"}, changes=["m:A.b"])
    assert record.as_dict() == {
        "id": "p",
        "status": "applied",
        "reason": "r",
        "versions": {"trl": "1"},
        "target": "",
        "changes": ("m:A.b",),
        "summary": "",
        "upstream": "",
    }
    assert record == PatchStatus(**record.as_dict())


def test_the_fields_most_entries_share_are_defaults():
    """An entry that names no trigger, target or module: the GRPO trainer's module and class, and
    the patch module named after its id (dashes as underscores, dots dropped)."""
    bare = {k: v for k, v in FIELDS.items() if k not in ("trigger", "must_exist")}
    patch = Patch(**dict(bare, id="grpo-eval-0.14"))
    assert (patch.trigger, patch.must_exist) == ("trl.trainer.grpo_trainer", "GRPOTrainer")
    assert patch.impl == "trl_compat.patches.grpo_eval_014" and patch.kind == "fix" and patch.fixed_in is None
    # given functions, no module is derived: the functions are the patch's
    probe = lambda module: needed("given")  # noqa: E731
    given = Patch(**bare, probe=probe, apply=lambda module, patcher: None)
    assert given.impl == "" and given.probe is probe
    # explicit values stay valid, and win
    explicit = Patch(**FIELDS, impl="trl_compat.patches.other")
    assert (explicit.trigger, explicit.must_exist, explicit.impl) == ("x.mod", "Cls.meth", "trl_compat.patches.other")


def test_kind_and_fixed_in():
    advice = Patch(**FIELDS, kind="advice", fixed_in={"vllm": "0.11.1"})
    assert advice.kind == "advice" and advice.fixed_in == {"vllm": "0.11.1"}
    assert Patch(**FIELDS, fixed_in={}).fixed_in == {}  # never fixed upstream
    with pytest.raises(ValueError, match="kind='advise' is not one of fix, advice"):
        Patch(**FIELDS, kind="advise")
