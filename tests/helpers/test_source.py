"""trl_compat._helpers.source: how every probe reads code (runs in every cell, trl or not)."""

import functools
import importlib
import sys
import uuid

from trl_compat._helpers.source import Code, SourceUnavailable, code, defining_class, module_code, normalise, unwrap

import pytest

SAMPLE = '''
def sync(self, prompts):
    """Docstring that mentions reset_prefix_cache."""
    # reset_prefix_cache would fix it
    "a bare string statement: reset_prefix_cache"
    out = self.llm.generate(
        'multi-line call',
        prompts)
    return prompt_ids[:, -self.max_prompt_length :]
'''


def test_comments_and_docstrings_are_not_code():
    text = Code(normalise(SAMPLE))
    assert "reset_prefix_cache" not in text
    assert "self.llm.generate(" in text


def test_strings_inside_calls_stay_even_across_lines():
    assert '"multi-line call"' in Code(normalise(SAMPLE))


def test_spacing_line_breaks_and_quote_style_do_not_matter():
    text = Code(normalise(SAMPLE))
    assert "prompt_ids[:, -self.max_prompt_length:]" in text
    assert "self.llm.generate('multi-line call', prompts)" in text
    assert "prompt_ids[:, -self.max_prompt_length + 1:]" not in text


def test_count_normalises_the_needle_as_in_does():
    source = Code(normalise("x.update( y )\nif y is not None:\n    x.update(y)\n"))
    assert source.count("x.update(y)") == 2 and source.count("if y is not None") == 1
    assert source.count("x.update(z)") == 0


def test_an_unclosed_fragment_still_matches():
    assert "generate(" in Code(normalise(SAMPLE))
    assert normalise("hasattr(model,") == "hasattr ( model ,"


def _decorated(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class Holder:
    @staticmethod
    def static():
        return "static_body_marker"

    @classmethod
    def klass(cls):
        return "class_body_marker"

    @_decorated
    def decorated(self):
        return "decorated_body_marker"


class Child(Holder):
    pass


@pytest.mark.parametrize(
    "obj, marker",
    [
        (vars(Holder)["static"], "static_body_marker"),
        (vars(Holder)["klass"], "class_body_marker"),
        (Holder.klass, "class_body_marker"),
        (Holder.decorated, "decorated_body_marker"),
        (Holder().decorated, "decorated_body_marker"),
    ],
)
def test_code_reads_through_descriptors_methods_and_wrappers(obj, marker):
    assert f'"{marker}"' in code(obj)
    assert unwrap(obj).__name__ in {"static", "klass", "decorated"}


def test_unreadable_source_says_why():
    with pytest.raises(SourceUnavailable, match="cannot read the source of len"):
        code(len)


def test_defining_class_walks_the_mro():
    assert defining_class(Child, "static") is Holder
    assert defining_class(Child, "__init__") is object
    assert defining_class(Child, "nowhere") is None


def test_a_probe_on_unreadable_source_is_undecided(tmp_path, monkeypatch):
    """The engine maps SourceUnavailable to "undecided" with the reason: nothing applied."""
    import trl_compat
    from trl_compat import _engine as engine

    name = "tcsrc_" + uuid.uuid4().hex[:8]
    (tmp_path / f"{name}.py").write_text("class Trainer:\n    def step(self):\n        return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TRL_COMPAT_STRICT", raising=False)
    module = importlib.import_module(name)
    patch = engine.Patch(
        id="test-src-" + name,
        summary="",
        upstream="",
        trigger=name,
        must_exist="Trainer.step",
        changes=("Trainer.step",),
        requires={},
        probe=lambda m: code(len) and engine.needed("never"),
        apply=lambda m, p: p.replace(m.Trainer, "step", lambda self: 2),
    )
    engine.register(patch)
    try:
        trl_compat.install(patch.id)
        assert trl_compat.status(patch.id) == trl_compat.UNDECIDED
        assert "cannot read the source of len" in {r.id: r.reason for r in trl_compat.report()}[patch.id]
        assert module.Trainer().step() == 1
    finally:
        engine.unregister(patch.id)
        sys.modules.pop(name, None)


def test_module_code_reads_a_submodule_without_importing_it_or_its_package(tmp_path, monkeypatch):
    name = f"pkg_{uuid.uuid4().hex[:8]}"
    (tmp_path / name / "sub").mkdir(parents=True)
    (tmp_path / name / "__init__.py").write_text("raise RuntimeError('the package ran')\n")
    (tmp_path / name / "sub" / "__init__.py").write_text("raise RuntimeError('the subpackage ran')\n")
    (tmp_path / name / "sub" / "mod.py").write_text("# a comment: not code\nfrom vllm.utils import get_open_port  # here\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = module_code(f"{name}.sub.mod")
    assert isinstance(source, Code) and "from vllm.utils import get_open_port" in source and "comment" not in source
    assert not [m for m in sys.modules if m.startswith(name)]
    with pytest.raises(ModuleNotFoundError, match="sub.missing"):
        module_code(f"{name}.sub.missing")
    (tmp_path / name / "sub" / "compiled.pyc").write_bytes(b"")
    with pytest.raises(SourceUnavailable, match="cannot find the source file"):
        module_code(f"{name}.sub.compiled")


def test_module_code_of_a_loaded_module_reads_its_file():
    assert "def module_code" in module_code("trl_compat._helpers.source")
