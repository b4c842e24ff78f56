"""Logging: every module logs to ``logging.getLogger(__name__)``, so all of trl_compat is under
the ``trl_compat`` logger; :func:`warn_once` is for a warning that a training step would
otherwise repeat on every step."""

from __future__ import annotations

import logging
import threading
from typing import Any, Hashable, Set, Tuple

_lock = threading.Lock()
_warned: Set[Tuple[str, Hashable]] = set()


def warn_once(logger: logging.Logger, key: Hashable, msg: str, *args: Any, exc_info: bool = False) -> bool:
    """``logger.warning(msg, *args, exc_info=...)`` the first time ``key`` comes up for ``logger``
    in this process; later calls with the same key say nothing. Returns whether it logged."""
    with _lock:
        if (logger.name, key) in _warned:
            return False
        _warned.add((logger.name, key))
    logger.warning(msg, *args, exc_info=exc_info, stacklevel=2)
    return True
