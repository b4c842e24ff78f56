"""Logging: every module logs to a logger named after it, so all of trl_compat is under the
``trl_compat`` logger; :func:`warn_once` is for a warning that a training step would otherwise
repeat on every step.

The engine and the activation code run at interpreter start-up (``TRL_COMPAT_AUTO=1``), where
importing :mod:`logging` would cost a third of starting Python. They log through
:func:`getLogger`, whose loggers import it only when a record could be heard: a warning or
worse always (``logging``'s last-resort handler prints it), a debug or info record only once
something has imported ``logging`` (before that, nothing can have given such a record a
handler or a level, so ``logging`` itself would drop it). Modules that run once TRL is
imported (the patches and their helpers) use ``logging.getLogger(__name__)`` directly.
"""

from __future__ import annotations

import _thread
import sys

WARNING = 30

_lock = _thread.allocate_lock()
_warned: set[tuple[str, object]] = set()  # (logger name, key)


class Logger:
    """The few ``logging.Logger`` methods the engine uses, importing ``logging`` on demand."""

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, msg: str, *args, **kwargs) -> None:
        self._log(10, msg, args, kwargs)

    def info(self, msg: str, *args, **kwargs) -> None:
        self._log(20, msg, args, kwargs)

    def warning(self, msg: str, *args, **kwargs) -> None:
        self._log(WARNING, msg, args, kwargs)

    def exception(self, msg: str, *args, **kwargs) -> None:
        self._log(40, msg, args, dict(kwargs, exc_info=True))

    def _log(self, level: int, msg: str, args: tuple, kwargs: dict) -> None:
        if level < WARNING and "logging" not in sys.modules:
            return
        import logging

        # +2: this method and the public one above it, so the record names the real caller
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2
        logging.getLogger(self.name).log(level, msg, *args, **kwargs)


def getLogger(name: str) -> Logger:  # logging's name, so call sites read the same
    return Logger(name)


def warn_once(logger, key, msg: str, *args, exc_info: bool = False) -> bool:
    """``logger.warning(msg, *args, exc_info=...)`` the first time ``key`` comes up for ``logger``
    (a ``logging.Logger`` or one of :func:`getLogger`'s) in this process; later calls with the
    same key say nothing. Returns whether it logged."""
    with _lock:
        if (logger.name, key) in _warned:
            return False
        _warned.add((logger.name, key))
    logger.warning(msg, *args, exc_info=exc_info, stacklevel=2)
    return True
