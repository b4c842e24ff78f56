"""trl_compat._engine.guarded: the one run-time fallback of a wrapper's own bookkeeping."""

import logging
import uuid

from trl_compat import _engine as engine

import pytest


def _bookkeeping_that_fails():
    raise ValueError("bookkeeping broke")


def test_an_error_is_logged_once_with_its_traceback_and_the_code_after_runs(caplog):
    doing = "counting " + uuid.uuid4().hex
    log = logging.getLogger("trl_compat.test_fallback")
    ran_after = []
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        for _ in range(3):
            with engine.guarded("test-guard", doing, fallback="TRL's own sync runs", logger=log) as guard:
                _bookkeeping_that_fails()
                ran_after.append("inside")  # never reached
            ran_after.append("after")
    assert ran_after == ["after"] * 3
    assert guard.failed and isinstance(guard.error, ValueError)
    assert [r.getMessage() for r in caplog.records] == [
        f"trl_compat: test-guard: {doing} failed (ValueError: bookkeeping broke); TRL's own sync runs"
    ]
    assert caplog.records[0].name == "trl_compat.test_fallback"
    assert caplog.records[0].exc_info[1].args == ("bookkeeping broke",)


def test_nothing_raised_nothing_logged(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        with engine.guarded("test-guard", "a step that works") as guard:
            value = 1
    assert value == 1 and not guard.failed and guard.error is None and caplog.records == []


def test_the_default_logger_is_under_trl_compat(caplog):
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        with engine.guarded("test-guard", "default logger " + uuid.uuid4().hex):
            _bookkeeping_that_fails()
    assert caplog.records[0].name == "trl_compat.fallback"


def test_strict_mode_lets_the_error_through(monkeypatch):
    monkeypatch.setenv("TRL_COMPAT_STRICT", "1")
    with pytest.raises(ValueError, match="bookkeeping broke"):
        with engine.guarded("test-guard", "strict"):
            _bookkeeping_that_fails()


def test_keyboard_interrupt_is_never_caught():
    with pytest.raises(KeyboardInterrupt):
        with engine.guarded("test-guard", "interrupted"):
            raise KeyboardInterrupt
