"""The run-time fallback for a wrapper's own bookkeeping: an error in it is logged once and the
wrapper falls back to TRL's own behaviour (sentry's ``capture_internal_exceptions``)::

    with guarded(PATCH_ID, "preparing the model") as guard:
        prepare(model)
    if guard.failed:
        ...  # optional: what falling back means here
    return original(self, *args, **kwargs)

Only the bookkeeping goes inside: never the call to TRL's original (its errors are the user's)
and never a fix whose failure must reach the user because falling back would be the bug
itself; such a patch says "load-bearing: errors propagate" in its docstring. Under
``TRL_COMPAT_STRICT=1`` the error propagates, as every other fallback of trl_compat does.
"""

from __future__ import annotations

from trl_compat._engine import logs
from trl_compat._engine.settings import strict

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import TracebackType
    from typing import Any

_log = logs.getLogger("trl_compat.fallback")


class Fallback:
    """The context manager :func:`guarded` returns; ``error`` is what it caught (None if nothing)."""

    __slots__ = ("patch_id", "doing", "fallback", "logger", "error")

    def __init__(self, patch_id: str, doing: str, fallback: str, logger: Any) -> None:
        self.patch_id, self.doing, self.fallback, self.logger = patch_id, doing, fallback, logger
        self.error: Exception | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def __enter__(self) -> Fallback:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None) -> bool:
        if not isinstance(error, Exception):  # nothing raised, or KeyboardInterrupt and the like
            return False
        self.error = error
        if strict():
            return False
        logs.warn_once(
            self.logger,
            ("guarded", self.patch_id, self.doing),
            "trl_compat: %s: %s failed (%s: %s); %s",
            self.patch_id,
            self.doing,
            type(error).__name__,
            error,
            self.fallback,
            exc_info=True,
        )
        return True


def guarded(patch_id: str, doing: str, fallback: str = "TRL runs unchanged", logger: Any = None) -> Fallback:
    """Catch an error of a wrapper's own bookkeeping (``doing``, e.g. "preparing the model"):
    log it once per ``(patch_id, doing)`` with its traceback on ``logger`` (default:
    ``trl_compat.fallback``), then let the code after the ``with`` block run (``fallback`` says
    what that means). Re-raises under ``TRL_COMPAT_STRICT=1``, and never catches
    ``BaseException`` that is no ``Exception`` (KeyboardInterrupt)."""
    return Fallback(patch_id, doing, fallback, logger if logger is not None else _log)
