"""The patch engine: one registry, one way to gate, one way to apply and revert.

A patch is declared once as a :class:`Patch`: data, plus the module of its ``probe`` and
``apply`` (``trl_compat/patches/__init__.py`` holds them all). Its life:

1. *Gate* (at ``install()``, cheap; :mod:`.versions`): the installed versions, read from
   the distributions' metadata without importing anything, must lie in the patch's
   windows. Out of window: "not needed". Unreadable version: "unknown version".
2. *Wait* (:mod:`.hooks`): a post-import hook on the patch's trigger module. It fires at
   once if the module is already imported, so import order does not matter.
3. *Probe* the real code (the patch's module is imported now, not before): only a probe that
   finds the bug lets the patch apply.
4. *Apply* through a :class:`Patcher` (:mod:`.patcher`), which records every attribute it
   changes. If ``apply`` raises, the records are undone: nothing is left
   half-patched. ``revert()`` undoes the same records (:mod:`.lifecycle`).

:mod:`.state` holds the registry and sets statuses, :mod:`.reporting` reads them back.
Nothing here raises into the user's program unless ``TRL_COMPAT_STRICT=1``.
"""

from trl_compat._engine.lifecycle import install, revert, unregister
from trl_compat._engine.logs import warn_once
from trl_compat._engine.patch import (
    _TROUBLE,  # noqa: F401 - for tests, as the module had it
    APPLIED,
    CONFLICT,
    DISABLED,
    FAILED,
    NOT_NEEDED,
    PENDING,
    REVERTED,
    TARGET_MISSING,
    UNDECIDED,
    UNKNOWN_VERSION,
    Patch,
    PatchStatus,
    SourceUnavailable,
    TrlCompatError,
    Verdict,
    needed,
    not_needed,
    undecided,
)
from trl_compat._engine.patcher import MARKER, AlreadyPatched, Patcher, markers, raw_attribute
from trl_compat._engine.reporting import applied, report, status
from trl_compat._engine.state import _registry, _states, register, registry, strict, switched_on  # noqa: F401 - tests read and swap entries
from trl_compat._engine.versions import affected, dist_version, gate

__all__ = [
    "APPLIED", "CONFLICT", "DISABLED", "FAILED", "MARKER", "NOT_NEEDED", "PENDING", "REVERTED",
    "TARGET_MISSING", "UNDECIDED", "UNKNOWN_VERSION", "AlreadyPatched", "Patch", "PatchStatus",
    "Patcher", "SourceUnavailable", "TrlCompatError", "Verdict", "affected", "applied", "dist_version", "gate", "install",
    "markers", "needed", "not_needed", "raw_attribute", "register", "registry", "report", "revert",
    "status", "strict", "switched_on", "undecided", "unregister", "warn_once",
]
