"""trl_compat.testing: what tests reach of the engine's state, without its private modules."""

import importlib

import trl_compat
from trl_compat import _engine as engine
from trl_compat import testing


def test_forced_runs_the_given_probe_and_puts_the_declaration_back(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, probe=lambda m: engine.not_needed("fixed"))
    with testing.forced(patch.id, probe=lambda m: engine.needed("forced")) as forced:
        assert forced.apply is patch.apply and forced.probe is not patch.probe
        trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED and mod.Trainer().step(1) == ("patched", 1)
    assert testing.snapshot()[patch.id] is patch
    assert mod.Trainer in testing.changed_owners()


def test_restore_forgets_what_was_registered_since_and_reverts_it(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    saved = testing.snapshot()
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    assert mod.Trainer().step(1) == ("patched", 1)
    testing.restore(saved)
    assert patch.id not in testing.snapshot() and list(testing.snapshot()) == list(saved)
    assert "step" not in vars(mod.Trainer)


def test_forget_leaves_the_changes_in_place(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    testing.forget(patch.id)
    assert patch.id not in testing.snapshot()
    assert mod.Trainer().step(2) == ("patched", 2)
    delattr(mod.Trainer, "step")
