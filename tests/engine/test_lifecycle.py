"""trl_compat._engine.lifecycle and .state on synthetic modules: install, hook, probe, apply,
revert, stacking, strict mode, switches. Runs in every cell, trl or not."""

import importlib
import json
import logging
import os
import subprocess
import sys
import threading

import trl_compat
from trl_compat import _engine as engine
from trl_compat import testing
from trl_compat._engine import Patch, needed, not_needed, undecided
from trl_compat.patches import PATCHES

import pytest

from cells import engine_cells


def test_applies_when_the_module_is_imported_after_install(fake_pkg, make_patch):
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.PENDING
    mod = importlib.import_module(fake_pkg)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED
    assert mod.Trainer().step(1) == ("patched", 1)
    assert patch.id in trl_compat.applied()


def test_applies_when_the_module_was_imported_before(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED
    assert mod.Trainer().step(2) == ("patched", 2)


def test_install_twice_wraps_once(fake_pkg, make_patch, calls):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    trl_compat.install(patch.id)
    importlib.import_module(fake_pkg)
    assert mod.Trainer().step(3) == ("patched", 3)
    assert calls == [(3,)]


def test_concurrent_installs_wrap_once(fake_pkg, make_patch, calls):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    barrier = threading.Barrier(4)

    def go():
        barrier.wait()
        trl_compat.install(patch.id)

    threads = [threading.Thread(target=go) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    mod.Trainer().step(4)
    assert calls == [(4,)]


def test_revert_of_an_inherited_method_deletes_it(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    assert "step" not in vars(mod.Trainer)
    trl_compat.install(patch.id)
    assert "step" in vars(mod.Trainer)
    trl_compat.revert(patch.id)
    assert "step" not in vars(mod.Trainer)
    assert mod.Trainer().step(5) == ("base", 5)
    assert trl_compat.status(patch.id) == trl_compat.REVERTED
    trl_compat.install(patch.id)  # and it can come back
    assert mod.Trainer().step(6) == ("patched", 6)


def test_revert_restores_an_own_attribute_exactly(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    before = vars(mod.Trainer)["other"]

    def apply(module, patcher):
        patcher.replace(module.Trainer, "other", lambda self: "patched")

    patch = make_patch(fake_pkg, target="Trainer.other", apply=apply)
    trl_compat.install(patch.id)
    assert mod.Trainer().other() == "patched"
    trl_compat.revert(patch.id)
    assert vars(mod.Trainer)["other"] is before


def test_revert_neutralises_a_hook_that_has_not_fired(fake_pkg, make_patch):
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    trl_compat.revert(patch.id)
    mod = importlib.import_module(fake_pkg)
    assert mod.Trainer().step(7) == ("base", 7)
    assert trl_compat.status(patch.id) == trl_compat.REVERTED


def _tagging(tag):
    """An apply that wraps Trainer.step, adding ``tag`` to the result."""

    def apply(module, patcher):
        inner = module.Trainer.step

        def step(self, *args, **kwargs):
            return (tag,) + inner(self, *args, **kwargs)

        patcher.replace(module.Trainer, "step", step)

    return apply


def test_a_patch_applied_for_the_first_time_goes_below_later_ones(fake_pkg, monkeypatch, make_patch):
    """An opt-in patch switched on after start-up (or any patch applied late) has never
    changed anything yet: it must still land below the later-registered patches on the same
    method, or reverting one of those later leaves it wrapped in place ("replaced after
    us") and a re-install finds its marker and skips ("already patched")."""
    mod = importlib.import_module(fake_pkg)
    monkeypatch.delenv("TEST_TRL_COMPAT_LATE", raising=False)
    late = Patch(
        id="test-late",
        summary="",
        upstream="",
        trigger=fake_pkg,
        must_exist="Trainer.step",
        requires={},
        changes=("Trainer.step",),
        probe=lambda m: needed("bug found"),
        apply=_tagging("late"),
        opt_in="TEST_TRL_COMPAT_LATE",
    )
    engine.register(late)
    upper = make_patch(fake_pkg, apply=_tagging("upper"))
    trl_compat.install(late.id, upper.id)
    assert trl_compat.status(late.id) == trl_compat.DISABLED
    assert mod.Trainer().step(1) == ("upper", "base", 1)

    monkeypatch.setenv("TEST_TRL_COMPAT_LATE", "1")
    trl_compat.install(late.id)
    assert mod.Trainer().step(2) == ("upper", "late", "base", 2)
    trl_compat.revert(upper.id)
    assert mod.Trainer().step(3) == ("late", "base", 3)
    trl_compat.install(upper.id)
    trl_compat.revert(late.id)
    assert mod.Trainer().step(4) == ("upper", "base", 4)
    assert trl_compat.status(upper.id) == trl_compat.APPLIED


def test_reverting_the_lower_of_two_stacked_patches(fake_pkg, make_patch):
    """Two patches wrap the same method; reverting the first one must remove it for
    real (not leave it under the second) and keep the second one working."""
    mod = importlib.import_module(fake_pkg)
    lower = make_patch(fake_pkg, apply=_tagging("lower"))
    upper = make_patch(fake_pkg, apply=_tagging("upper"))
    trl_compat.install(lower.id, upper.id)
    assert mod.Trainer().step(1) == ("upper", "lower", "base", 1)

    trl_compat.revert(lower.id)
    assert mod.Trainer().step(2) == ("upper", "base", 2)
    assert trl_compat.status(lower.id) == trl_compat.REVERTED
    assert trl_compat.status(upper.id) == trl_compat.APPLIED

    # back on, below the upper one again: stacking follows registration order, whatever
    # order revert() and install() are called in (the upper one may rely on the lower one)
    trl_compat.install(lower.id)
    assert mod.Trainer().step(3) == ("upper", "lower", "base", 3)
    assert trl_compat.status(upper.id) == trl_compat.APPLIED
    trl_compat.revert(lower.id)
    trl_compat.install()  # everything: the applied upper one is not skipped over
    assert mod.Trainer().step(4) == ("upper", "lower", "base", 4)
    trl_compat.revert(lower.id, upper.id)
    assert "step" not in vars(mod.Trainer)
    assert mod.Trainer().step(5) == ("base", 5)


def test_reverting_the_upper_of_two_stacked_patches(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    lower = make_patch(fake_pkg, apply=_tagging("lower"))
    upper = make_patch(fake_pkg, apply=_tagging("upper"))
    trl_compat.install(lower.id, upper.id)
    trl_compat.revert(upper.id)
    assert mod.Trainer().step(1) == ("lower", "base", 1)
    assert trl_compat.status(lower.id) == trl_compat.APPLIED
    trl_compat.revert(lower.id)
    assert "step" not in vars(mod.Trainer)


def test_apply_that_raises_half_way_leaves_nothing_patched(fake_pkg, caplog, make_patch):
    mod = importlib.import_module(fake_pkg)
    before = dict(vars(mod.Trainer))

    def apply(module, patcher):
        patcher.replace(module.Trainer, "step", lambda self, x: "half")
        patcher.replace(module.Trainer, "other", lambda self: "half")
        raise RuntimeError("boom after two changes")

    patch = make_patch(fake_pkg, apply=apply, changes=("Trainer.step", "Trainer.other"))
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.FAILED
    assert "boom after two changes" in caplog.text and patch.id in caplog.text
    assert dict(vars(mod.Trainer)) == before
    assert mod.Trainer().step(8) == ("base", 8)


def test_probe_that_raises_is_reported_not_raised(fake_pkg, caplog, make_patch):
    importlib.import_module(fake_pkg)

    def probe(module):
        raise ValueError("probe exploded")

    patch = make_patch(fake_pkg, probe=probe)
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.FAILED
    assert "probe exploded" in caplog.text


def test_strict_mode_raises(fake_pkg, monkeypatch, make_patch):
    importlib.import_module(fake_pkg)
    monkeypatch.setenv("TRL_COMPAT_STRICT", "1")

    def probe(module):
        raise ValueError("probe exploded")

    patch = make_patch(fake_pkg, probe=probe)
    with pytest.raises(trl_compat.TrlCompatError, match="probe exploded"):
        trl_compat.install(patch.id)


def test_strict_mode_raises_at_import_time(fake_pkg, monkeypatch, make_patch):
    monkeypatch.setenv("TRL_COMPAT_STRICT", "1")
    patch = make_patch(fake_pkg, target="Trainer.renamed_method")
    trl_compat.install(patch.id)
    with pytest.raises(trl_compat.TrlCompatError, match="target missing"):
        importlib.import_module(fake_pkg)


def test_missing_target(fake_pkg, caplog, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, target="Trainer.renamed_method")
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.TARGET_MISSING
    assert "renamed_method" in caplog.text
    assert mod.Trainer().step(9) == ("base", 9)


def test_probe_verdicts(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    fixed = make_patch(fake_pkg, probe=lambda m: not_needed("fixed upstream"))
    unsure = make_patch(fake_pkg, probe=lambda m: undecided("cannot tell"))
    trl_compat.install(fixed.id, unsure.id)
    assert trl_compat.status(fixed.id) == trl_compat.NOT_NEEDED
    assert trl_compat.status(unsure.id) == trl_compat.UNDECIDED
    assert "step" not in vars(mod.Trainer)
    reasons = {r.id: r.reason for r in trl_compat.report()}
    assert reasons[fixed.id] == "fixed upstream" and reasons[unsure.id] == "cannot tell"


def test_an_advice_entry_that_finds_its_bug_is_undecided_and_never_applies(fake_pkg, make_patch, calls):
    mod = importlib.import_module(fake_pkg)
    fix = make_patch(fake_pkg)  # bug found, wraps Trainer.step
    advice = fix.replace(id=fix.id + "-advice", kind="advice")
    engine.register(advice)
    try:
        trl_compat.install(advice.id)
        assert trl_compat.status(advice.id) == trl_compat.UNDECIDED
        assert "advice only" in {r.id: r.reason for r in trl_compat.report()}[advice.id]
        assert mod.Trainer().step(1) == ("base", 1) and calls == []  # its apply never ran
    finally:
        engine.unregister(advice.id)


@pytest.mark.parametrize("value", ["one-id", "*", " x , one-id "])
def test_disable(fake_pkg, monkeypatch, value, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, pid="test-one-id")
    monkeypatch.setenv("TRL_COMPAT_DISABLE", value.replace("one-id", patch.id))
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.DISABLED
    assert mod.Trainer().step(10) == ("base", 10)


def test_a_second_copy_of_the_engine_does_not_wrap_again(fake_pkg, make_patch, calls):
    mod = importlib.import_module(fake_pkg)
    first = make_patch(fake_pkg, pid="test-twin")
    trl_compat.install(first.id)
    # What a reloaded copy of trl_compat sees: the class is patched, its own state is fresh.
    testing.forget("test-twin")
    make_patch(fake_pkg, pid="test-twin")
    trl_compat.install("test-twin")
    assert trl_compat.status("test-twin") == trl_compat.APPLIED
    assert "already patched" in {r.id: r.reason for r in trl_compat.report()}["test-twin"]
    assert mod.Trainer().step(11) == ("patched", 11)
    assert calls == [(11,)]
    delattr(mod.Trainer, "step")  # the first copy's wrapper; no record of it is left to revert


def test_a_replaced_class_is_a_conflict_not_a_double_patch(fake_pkg, caplog, make_patch):
    mod = importlib.import_module(fake_pkg)
    # What Unsloth does: a class rebuilt elsewhere is bound under TRL's name.
    rebuilt = type("UnslothTrainer", (mod.Base,), {"__module__": "unsloth_compiled_cache.UnslothTrainer"})
    mod.Trainer = rebuilt
    patch = make_patch(fake_pkg)
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.CONFLICT
    assert "unsloth_compiled_cache.UnslothTrainer" in caplog.text
    assert "step" not in vars(rebuilt)


def _prefixing(original):
    def wrapper(*args, **kwargs):
        return ("wrapped",) + original(*args, **kwargs)

    return wrapper


def test_already_patched_by_another_copy_is_reported_and_nothing_changes(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, apply=lambda m, p: p.wrap(m.Trainer, "step", _prefixing))
    other_copy = engine.Patcher(patch.id)
    other_copy.wrap(mod.Trainer, "step", _prefixing)
    try:
        trl_compat.install(patch.id)
        record = {r.id: r for r in trl_compat.report()}[patch.id]
        assert record.status == trl_compat.APPLIED and "another copy" in record.reason
        assert mod.Trainer().step(1) == ("wrapped", "base", 1)
    finally:
        other_copy.undo()


def test_on_undo_runs_on_revert_and_on_rollback(fake_pkg, make_patch):
    importlib.import_module(fake_pkg)
    undone = []

    def apply(module, patcher):
        patcher.on_undo(lambda: undone.append("state"))
        patcher.wrap(module.Trainer, "step", _prefixing)

    patch = make_patch(fake_pkg, apply=apply)
    trl_compat.install(patch.id)
    trl_compat.revert(patch.id)
    assert undone == ["state"]

    def broken(module, patcher):
        apply(module, patcher)
        raise RuntimeError("half-way")

    failing = make_patch(fake_pkg, apply=broken)
    trl_compat.install(failing.id)
    assert trl_compat.status(failing.id) == trl_compat.FAILED and undone == ["state", "state"]


def test_an_opt_in_patch_is_disabled_until_its_switch_is_on(fake_pkg, monkeypatch, caplog, wrap_step):
    mod = importlib.import_module(fake_pkg)
    monkeypatch.delenv("TEST_TRL_COMPAT_OPT_IN", raising=False)
    patch = Patch(
        id="test-opt-in",
        summary="",
        upstream="",
        trigger=fake_pkg,
        must_exist="Trainer.step",
        requires={},
        changes=("Trainer.step",),
        probe=lambda m: needed("bug found"),
        apply=wrap_step,
        opt_in="TEST_TRL_COMPAT_OPT_IN",
    )
    engine.register(patch)
    with caplog.at_level(logging.INFO, logger="trl_compat"):
        trl_compat.install(patch.id)
    record = {r.id: r for r in trl_compat.report()}[patch.id]
    assert record.status == trl_compat.DISABLED
    assert record.reason == "opt-in, off: bug found; set TEST_TRL_COMPAT_OPT_IN=1 to apply the fix"
    assert any("TEST_TRL_COMPAT_OPT_IN=1" in r.getMessage() and r.levelname == "INFO" for r in caplog.records)
    assert mod.Trainer().step(1) == ("base", 1)
    monkeypatch.setenv("TEST_TRL_COMPAT_OPT_IN", "1")
    trl_compat.revert(patch.id)
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED and mod.Trainer().step(2) == ("patched", 2)


# What ``import trl_compat`` must not load at start-up: each costs a good part of starting Python.
STARTUP_FREE = (
    "logging",
    "re",
    "typing",
    "dataclasses",
    "inspect",
    "threading",
    "ast",
    "tokenize",
    "packaging",
    "importlib.metadata",
    "torch",
    "trl",
    "transformers",
)
LOADED = """
import sys
import trl_compat
out = {"startup": sorted(m for m in sys.modules if m.startswith("trl_compat.patches.") or m in %r)}
import json
if %r:
    import trl.trainer.grpo_trainer
    out["after"] = sorted(m for m in sys.modules if m.startswith("trl_compat.patches."))
    out["report"] = [[p.id, trl_compat.status(p.id), trl_compat._engine.gate(p)[0] is None] for p in trl_compat._engine.registry()]
print(json.dumps(out))
""".strip()


@engine_cells
@pytest.mark.every_cell  # reads the installed stack
def test_import_loads_no_patch_module_until_its_trigger_module_is_imported(tmp_path):
    """``import trl_compat`` reads the registry's data only: no patch module and none of the heavy
    standard library. Importing TRL loads the modules of the patches in their window, not the rest."""
    with_trl = importlib.util.find_spec("trl") is not None
    # the default start-up: not the off-policy guard's (TRL_COMPAT_GUARD=strict in every matrix cell), which
    # imports its modules at `import trl_compat` by design
    env = {k: v for k, v in os.environ.items() if k not in ("TRL_COMPAT_AUTO", "PYTHONPATH", "TRL_COMPAT_GUARD")}
    out = subprocess.run(
        [sys.executable, "-c", LOADED % (STARTUP_FREE, with_trl)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["startup"] == []
    if with_trl:
        codes = {p.id: p.impl for p in PATCHES}
        gated_out = {pid for pid, _, in_window in facts["report"] if not in_window}
        applied = {pid for pid, status, _ in facts["report"] if status == trl_compat.APPLIED}  # none on the newest TRL
        assert {codes[pid] for pid in applied} <= set(facts["after"])
        assert {codes[pid] for pid in gated_out}.isdisjoint(facts["after"])


LAZY = """
import json, sys
import trl_compat
out = {"startup": sorted(m for m in sys.modules if m.startswith("trl_compat"))}
import tcfake_lazy.trainer  # a module of no interest to trl_compat: nothing loads
out["other import"] = sorted(m for m in sys.modules if m.startswith("trl_compat"))
import trl  # the stand-in package below: the registry loads before its code runs
out["trl saw"] = trl.SEEN
out["report"] = len(trl_compat.report())
print(json.dumps(out))
""".strip()


def test_import_watches_for_trl_and_loads_the_registry_before_its_code_runs(tmp_path):
    """``import trl_compat`` imports the package, the engine's package and its hooks module, no more;
    the registry, the settings and the patches' gates load when ``trl`` is about to be imported:
    ``trl``'s own code already finds every patch registered and gated."""
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text(
        "import sys\nSEEN = len(sys.modules['trl_compat._engine.state'].REGISTRY._patches)\n"
    )
    (tmp_path / "tcfake_lazy").mkdir()
    (tmp_path / "tcfake_lazy" / "__init__.py").write_text("")
    (tmp_path / "tcfake_lazy" / "trainer.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("TRL_COMPAT_AUTO", "TRL_COMPAT_GUARD")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), os.path.dirname(os.path.dirname(trl_compat.__file__))])
    out = subprocess.run([sys.executable, "-c", LAZY], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout.splitlines()[-1])
    assert facts["startup"] == ["trl_compat", "trl_compat._engine", "trl_compat._engine.hooks"]
    assert facts["other import"] == facts["startup"]
    assert facts["trl saw"] == len(PATCHES) == facts["report"]


def test_a_bad_setting_is_told_when_trl_is_imported(tmp_path):
    """Deferred with the registry: a TRL_COMPAT_* value that is not accepted is said on stderr
    when trl_compat first reads it, at TRL's import (not at ``import trl_compat``)."""
    (tmp_path / "trl").mkdir()
    (tmp_path / "trl" / "__init__.py").write_text("")
    env = {k: v for k, v in os.environ.items() if k not in ("TRL_COMPAT_AUTO", "TRL_COMPAT_GUARD")}
    source = os.path.dirname(os.path.dirname(trl_compat.__file__))
    env.update(TRL_COMPAT_STRICT="enabled", PYTHONPATH=os.pathsep.join([str(tmp_path), source]))
    code = "import sys, trl_compat; sys.stderr.write('<imported>'); import trl"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    before, _, after = out.stderr.partition("<imported>")
    assert "TRL_COMPAT_STRICT='enabled' is not a recognised value" in after and "TRL_COMPAT_STRICT" not in before
