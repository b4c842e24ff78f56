"""The guard's switch, floor 1: its mode (off | on | strict), the depth of ``observing()`` blocks,
``pause()``; the guard's id and logger, once. Imports nothing of the guard."""

from __future__ import annotations

import logging
import threading

GUARD_ID = "offpolicy-guard"  # the id the guard's own bookkeeping reports under (``_engine.guarded``)
log = logging.getLogger("trl_compat.guard")


class _Switch:
    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.mode = "off"  # off | on | strict
        self.observing = 0  # depth of observing() blocks: alarms are not raised
        self.resumed: str | None = None  # the mode pause() keeps for resuming


_SWITCH = _Switch()


def active() -> bool:
    return _SWITCH.mode != "off"


def is_strict() -> bool:
    return _SWITCH.mode == "strict" and not _SWITCH.observing


def observing_now() -> bool:
    return bool(_SWITCH.observing)


def mode() -> str:
    return _SWITCH.mode


def switch(new: str) -> str:
    """Set the mode (the installer's verb); returns the mode it replaced."""
    with _SWITCH.lock:
        old, _SWITCH.mode, _SWITCH.resumed = _SWITCH.mode, new, None
    return old


def pause(paused: bool) -> None:
    """Stop (True) or resume (False) checking without undoing anything: the hooks pass straight
    through while paused. For measuring the guard's cost in one run."""
    with _SWITCH.lock:
        if paused and _SWITCH.mode != "off":
            _SWITCH.resumed, _SWITCH.mode = _SWITCH.mode, "off"
        elif not paused and _SWITCH.resumed is not None:
            _SWITCH.mode, _SWITCH.resumed = _SWITCH.resumed, None


class observing:
    """``with trl_compat.guard.observing():`` alarms are logged and counted but not raised (tests
    that reproduce a bug on purpose)."""

    def __enter__(self) -> observing:
        with _SWITCH.lock:
            _SWITCH.observing += 1
        return self

    def __exit__(self, *exc: BaseException | None) -> None:
        with _SWITCH.lock:
            _SWITCH.observing -= 1
