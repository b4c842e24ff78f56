"""Fault injection on the real pinned TRL: whatever goes wrong, each patch ends
exactly as before or exactly as patched, with a clear log line.

Every test is parametrised over the patches that apply in this cell; the others
are skipped with the reason, and so is a patch in a default cell inside its window, whose two
ends run it (tests/support/cells.py)."""

import json
import logging
import sys
import textwrap

import trl_compat
from trl_compat import _engine as engine
from trl_compat import testing
from trl_compat.patches import PATCHES

import pytest

from cells import engine_cells, skip_inside_window

pytest.importorskip("trl")
import trl.models.utils
import trl.trainer.grpo_trainer  # noqa: F401

IDS = [p.id for p in engine.registry()]


# What the applied patches' Patchers recorded changes on, taken now, while every one that applies in
# this cell is on: TRL's classes, and any module or class outside TRL (transformers5-warnings-issued
# changes transformers' PreTrainedModel).
RECORDED = testing.changed_owners()


def trl_namespaces():
    """Every namespace a patch may touch: TRL's modules and their classes, and the owners recorded above."""
    spaces = []
    for name, mod in list(sys.modules.items()):
        if name == "trl" or name.startswith("trl."):
            spaces.append((name, mod))
            spaces += [(f"{name}.{k}", v) for k, v in vars(mod).items() if isinstance(v, type) and v.__module__ == name]
    seen = {id(space) for _, space in spaces}
    return spaces + [
        (o.__name__ if isinstance(o, type(sys)) else f"{o.__module__}.{o.__qualname__}", o) for o in RECORDED if id(o) not in seen
    ]


def snapshot():
    # the values themselves, not their id(): a wrapper freed by revert() and a new one made by
    # install() can share an id
    return {name: dict(vars(space)) for name, space in trl_namespaces()}


_ABSENT = object()


def differences(a, b):
    return sorted(
        f"{space}.{k}"
        for space in set(a) | set(b)
        for k in set(a.get(space, {})) | set(b.get(space, {}))
        if a.get(space, {}).get(k, _ABSENT) is not b.get(space, {}).get(k, _ABSENT)
    )


@pytest.fixture
def applied_patch(request, monkeypatch):
    pid = request.param
    monkeypatch.delenv("TRL_COMPAT_STRICT", raising=False)
    if trl_compat.status(pid) != trl_compat.APPLIED:
        pytest.skip(f"{pid} is {trl_compat.status(pid)} in this cell")
    skip_inside_window(pid)
    saved = testing.snapshot()
    stack = stacked_with(pid)
    was_applied = trl_compat.applied()
    yield saved[pid]
    testing.restore(saved)
    trl_compat.revert(*stack)
    trl_compat.install(*stack)
    # a patch stacked on the broken one was taken off and put back on the broken code with it
    # (and may say "target missing" now): every patch applied before is applied again
    trl_compat.install(*was_applied)
    assert {trl_compat.status(p) for p in was_applied} == {trl_compat.APPLIED}, trl_compat.report()


def stacked_with(pid):
    """``pid`` and the applied patches stacked with it, directly or through another (their
    declared ``changes`` overlap: vllm-merged-weights and vllm-prefix-cache on TRL 0.15.0): a
    test that breaks the attribute under one of them takes them all off, so that only ``pid``
    is put to the test."""
    declared = {record.id: set(record.changes) for record in trl_compat.report()}
    stack, grew = [pid], True
    while grew:  # and those stacked with them: revert() takes them off and puts them back too
        grew = False
        for other in trl_compat.applied():
            if other not in stack and any(declared[other] & declared[mine] for mine in stack):
                stack.append(other)
                grew = True
    return stack


def unpatched_snapshot(pid):
    trl_compat.revert(*stacked_with(pid))
    return snapshot()


def owner_and_attr(patch):
    """Where the target lives: (object holding it in its __dict__, attribute name)."""
    obj = sys.modules[patch.trigger]
    parts = patch.must_exist.split(".")
    for part in parts[:-1]:
        obj = getattr(obj, part)
    for holder in getattr(obj, "__mro__", (obj,)):
        if parts[-1] in vars(holder):
            return holder, parts[-1]
    raise AssertionError(f"{patch.must_exist} not found")


@pytest.mark.parametrize("applied_patch", IDS, indirect=True)
def test_a_removed_target_is_reported_and_nothing_is_patched(applied_patch, caplog):
    pid = applied_patch.id
    before = unpatched_snapshot(pid)
    owner, attr = owner_and_attr(applied_patch)
    if attr == "__name__":  # must_exist "__name__": the module itself (vllm-serve-get-open-port), not a name a release drops
        pytest.skip(f"{pid}'s target is its module itself: no release removes a module's __name__")
    where = owner.__name__ if isinstance(owner, type(sys)) else f"{owner.__module__}.{owner.__qualname__}"
    saved = vars(owner)[attr]
    delattr(owner, attr)
    try:
        with caplog.at_level(logging.WARNING, logger="trl_compat"):
            trl_compat.install(pid)
        assert trl_compat.status(pid) == trl_compat.TARGET_MISSING
        assert pid in caplog.text and "does not exist" in caplog.text
        removed = where + "." + attr
        changed = differences(before, snapshot())
        assert all(name == removed or name.startswith(removed + ".") for name in changed), changed
    finally:
        setattr(owner, attr, saved)


@pytest.mark.parametrize("applied_patch", IDS, indirect=True)
def test_a_probe_that_raises_leaves_trl_untouched(applied_patch, caplog):
    pid = applied_patch.id
    before = unpatched_snapshot(pid)

    def probe(module):
        raise RuntimeError("injected probe failure")

    with testing.forced(pid, probe=probe), caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(pid)
    assert trl_compat.status(pid) == trl_compat.FAILED
    assert "injected probe failure" in caplog.text
    assert differences(before, snapshot()) == []


@pytest.mark.parametrize("applied_patch", IDS, indirect=True)
def test_an_apply_that_raises_after_changing_things_is_rolled_back(applied_patch, caplog):
    pid = applied_patch.id
    before = unpatched_snapshot(pid)
    changed_by_apply = []

    def apply(module, patcher):
        applied_patch.apply(module, patcher)
        changed_by_apply.extend(differences(before, snapshot()))
        raise RuntimeError("injected apply failure")

    with testing.forced(pid, apply=apply), caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(pid)
    assert changed_by_apply, "the real apply changed nothing before the injected failure"
    assert trl_compat.status(pid) == trl_compat.FAILED
    assert "injected apply failure" in caplog.text and "rolled back" in caplog.text
    assert differences(before, snapshot()) == []


@pytest.mark.parametrize("applied_patch", IDS, indirect=True)
def test_revert_then_reapply(applied_patch):
    pid = applied_patch.id
    # the patches stacked with it come off and go back on with it: what they change besides the
    # shared attribute (peft-optional's module globals in the nopeft cell) is part of the picture
    stack = stacked_with(pid)
    patched = snapshot()
    before = unpatched_snapshot(pid)
    changed = differences(before, patched)
    assert changed, "the patch changed nothing"
    trl_compat.install(*stack)
    assert {trl_compat.status(p) for p in stack} == {trl_compat.APPLIED}
    assert differences(before, snapshot()) == changed
    trl_compat.revert(*stack)
    assert differences(before, snapshot()) == []


GRPO_PATCHES = [
    p.id for p in engine.registry() if p.trigger == "trl.trainer.grpo_trainer" and p.must_exist.split(".")[0] == "GRPOTrainer"
]


@pytest.mark.parametrize("applied_patch", GRPO_PATCHES, indirect=True)
def test_an_unsloth_style_replacement_is_a_conflict(applied_patch, caplog):
    pid = applied_patch.id
    module = sys.modules["trl.trainer.grpo_trainer"]
    trl_compat.revert(*stacked_with(pid))
    original = module.GRPOTrainer
    rebuilt = type("UnslothGRPOTrainer", (original,), {"__module__": "unsloth_compiled_cache.UnslothGRPOTrainer"})
    module.GRPOTrainer = rebuilt
    try:
        with caplog.at_level(logging.WARNING, logger="trl_compat"):
            trl_compat.install(pid)
        assert trl_compat.status(pid) == trl_compat.CONFLICT
        assert "UnslothGRPOTrainer" in caplog.text
        assert set(vars(rebuilt)) <= {"__module__", "__doc__"}
    finally:
        module.GRPOTrainer = original


METHOD_PATCHES = [p.id for p in engine.registry() if p.must_exist.startswith("GRPOTrainer.")]


@pytest.mark.parametrize("applied_patch", METHOD_PATCHES, indirect=True)
def test_a_user_subclass_that_overrides_the_target_is_reported(applied_patch):
    attr = applied_patch.must_exist.split(".", 1)[1]
    module = sys.modules[applied_patch.trigger]
    sub = type("MyGRPOTrainer", (module.GRPOTrainer,), {attr: lambda self, *a, **k: None, "__module__": "user_code"})
    reason = {r.id: r.reason for r in trl_compat.report()}[applied_patch.id]
    assert "user_code.MyGRPOTrainer" in reason and "super()" in reason
    del sub


@engine_cells
def test_importing_trl_compat_and_trl_in_two_threads_patches_once(fresh_cli, run_py):
    code = textwrap.dedent("""
        import json, threading, sys
        barrier = threading.Barrier(2)
        def a():
            barrier.wait(); import trl_compat
        def b():
            barrier.wait(); import trl.trainer.grpo_trainer, trl.models.utils
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        [t.start() for t in threads]; [t.join() for t in threads]
        import trl_compat, trl.trainer.grpo_trainer, trl.models.utils
        TRIGGERS
        from trl_compat._engine import markers
        doubles = []
        for name, mod in list(sys.modules.items()):
            if not (name == "trl" or name.startswith("trl.")):
                continue
            spaces = [mod] + [v for v in vars(mod).values() if isinstance(v, type) and v.__module__ == name]
            for space in spaces:
                for key, value in list(vars(space).items()):
                    # each wrapper adds its own id to the ids it carries from the one below
                    seen, level = [], value if callable(value) else None
                    while level is not None:
                        inner = getattr(level, "__wrapped__", None)
                        seen += sorted(markers(level) - markers(inner))
                        level = inner
                    if len(seen) != len(set(seen)):
                        doubles.append(f"{name}.{key}")
        print(json.dumps({"doubles": doubles, "report": [[r.id, r.status] for r in trl_compat.report()]}))
    """)
    # then every other trigger module the CLI imports (trl.scripts.vllm_serve, vllm.utils, ...)
    triggers = list(dict.fromkeys(p.trigger for p in PATCHES))
    out = run_py(code.replace("TRIGGERS", f"for m in {triggers!r}:\n    try: __import__(m)\n    except Exception: pass"))
    data = json.loads(out.strip().splitlines()[-1])
    assert data["doubles"] == []
    # the same statuses as a process that imported trl_compat, then TRL (the CLI's)
    assert data["report"] == [[r["id"], r["status"]] for r in fresh_cli[0]["patches"]]
