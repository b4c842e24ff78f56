"""The guard's bookkeeping between runs (no TRL needed): what one run leaves must not alarm, or be
raised, in the next. Each case was a false alarm of the matrix's strict negative control."""

from __future__ import annotations

import types

from trl_compat.guard import testing
from trl_compat.guard.observe import trainers
from trl_compat.guard.testing import LEDGER, Alarm

import pytest


@pytest.fixture(autouse=True)
def _alarms_fired_here_are_not_the_cells():
    """These tests fire alarms on purpose, outside any run: they leave the process's ledger as they
    found it, so the cell's guard counts (tests/conftest.py) hold only what GRPO runs raised."""
    before = len(LEDGER.alarms)
    yield
    del LEDGER.alarms[before:]


def _fake_trainer(step):
    # the guard recognises TRL's GRPOTrainer by class name and module
    cls = type("GRPOTrainer", (), {"__module__": "trl.trainer.grpo_trainer", "sync": lambda self: testing.sync_step()})
    trainer = cls()
    trainer.state = types.SimpleNamespace(global_step=step)
    return trainer


def test_a_sync_no_trainer_makes_is_at_step_0_whatever_the_last_trainer(monkeypatch):
    earlier = _fake_trainer(5)
    testing.run_of(earlier)  # an earlier run's trainer, alive and adopted
    assert testing.sync_step() == 0  # was 5: the earlier run's step made a new engine's first sync look post-step


def test_a_sync_is_at_the_step_of_the_trainer_making_it(monkeypatch):
    monkeypatch.setattr(trainers, "adopt", lambda trainer: None)  # no loss-side capture for a fake
    assert _fake_trainer(2).sync() == 2


def test_observed_alarms_are_never_raised_later():
    from trl_compat import guard

    LEDGER.take_unraised()
    with guard.observing():
        LEDGER.fire(Alarm("C", "test", "test"))
    LEDGER.fire(Alarm("P", "test", "test"))
    try:
        assert [a.check for a in guard.alarms()[-2:]] == ["C", "P"]
        assert [a.observed for a in guard.alarms()[-2:]] == [True, False]
        assert [a.check for a in LEDGER.unraised] == ["P"]
    finally:
        LEDGER.take_unraised()
        with LEDGER.lock:
            del LEDGER.alarms[-2:]
