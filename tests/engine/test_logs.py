"""trl_compat._engine.logs: every module logs under ``trl_compat``; a warning once per key."""

import importlib
import logging
import pkgutil
import uuid

from trl_compat._engine import warn_once


def test_warn_once_says_it_once_per_key_and_logger(caplog):
    key = uuid.uuid4().hex
    first, second = logging.getLogger("trl_compat.test_a"), logging.getLogger("trl_compat.test_b")
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        assert warn_once(first, key, "trl_compat: %s happened", "this") is True
        assert warn_once(first, key, "trl_compat: %s happened", "again") is False
        assert warn_once(second, key, "trl_compat: %s happened", "elsewhere") is True
    assert [r.getMessage() for r in caplog.records] == ["trl_compat: this happened", "trl_compat: elsewhere happened"]
    assert caplog.records[0].name == "trl_compat.test_a"
    assert caplog.records[0].funcName == "test_warn_once_says_it_once_per_key_and_logger"  # the caller, not us


def test_warn_once_can_carry_the_traceback(caplog):
    log = logging.getLogger("trl_compat.test_c")
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        try:
            raise ValueError("the cause")
        except ValueError:
            assert warn_once(log, uuid.uuid4().hex, "trl_compat: failed", exc_info=True) is True
    assert caplog.records[0].exc_info[1].args == ("the cause",)


def test_the_engine_logs_under_the_trl_compat_logger():
    """Each engine module logs to its own name, so ``logging.getLogger("trl_compat")`` (level,
    handlers) still governs them all."""
    engine = importlib.import_module("trl_compat._engine")
    named = 0
    for info in pkgutil.iter_modules(engine.__path__):
        module = importlib.import_module(f"trl_compat._engine.{info.name}")
        log = getattr(module, "log", None)
        if log is not None:
            assert log.name == module.__name__ and log.name.startswith("trl_compat."), info.name
            named += 1
    assert named >= 3
