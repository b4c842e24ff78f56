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
   changes and refuses one the patch's ``changes`` do not declare. If ``apply`` raises, the
   records are undone: nothing is left half-patched. ``revert()`` undoes the same records
   (:mod:`.lifecycle`).

:mod:`.state`'s :class:`~.state.Registry` owns the patches, their states and the lock;
:mod:`.lifecycle` changes them, :mod:`.reporting` reads them back. :mod:`.targets` resolves
what a patch declares it changes and how patches stack. At run time, a wrapper's own
bookkeeping goes through :func:`guarded` (:mod:`.fallback`). Nothing here raises into the user's
program unless ``TRL_COMPAT_STRICT=1``. Tests reach the engine's state through
:mod:`trl_compat.testing`.

The names below load with their submodule on first use (PEP 562): ``import trl_compat`` runs at
interpreter start-up under ``TRL_COMPAT_AUTO=1`` and imports only :mod:`.hooks` of this package
(no ``from __future__`` either: it is a module to import, too).
"""

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trl_compat._engine.fallback import guarded
    from trl_compat._engine.lifecycle import install, revert, stacking, unregister
    from trl_compat._engine.logs import warn_once
    from trl_compat._engine.patch import (
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
    from trl_compat._engine.patcher import (
        MARKER,
        AlreadyPatched,
        Patcher,
        UndeclaredChange,
        instance_overrides,
        markers,
        raw_attribute,
    )
    from trl_compat._engine.reporting import UnknownPatchId, applied, report, status
    from trl_compat._engine.settings import strict
    from trl_compat._engine.settings import switch as switched_on
    from trl_compat._engine.state import register, registry
    from trl_compat._engine.versions import affected, dist_version, gate

# name -> (submodule, attribute)
_LAZY = {
    "APPLIED": ("patch", "APPLIED"),
    "AlreadyPatched": ("patcher", "AlreadyPatched"),
    "CONFLICT": ("patch", "CONFLICT"),
    "DISABLED": ("patch", "DISABLED"),
    "FAILED": ("patch", "FAILED"),
    "MARKER": ("patcher", "MARKER"),
    "NOT_NEEDED": ("patch", "NOT_NEEDED"),
    "PENDING": ("patch", "PENDING"),
    "Patch": ("patch", "Patch"),
    "PatchStatus": ("patch", "PatchStatus"),
    "Patcher": ("patcher", "Patcher"),
    "REVERTED": ("patch", "REVERTED"),
    "SourceUnavailable": ("patch", "SourceUnavailable"),
    "TARGET_MISSING": ("patch", "TARGET_MISSING"),
    "TrlCompatError": ("patch", "TrlCompatError"),
    "UNDECIDED": ("patch", "UNDECIDED"),
    "UNKNOWN_VERSION": ("patch", "UNKNOWN_VERSION"),
    "UndeclaredChange": ("patcher", "UndeclaredChange"),
    "UnknownPatchId": ("reporting", "UnknownPatchId"),
    "Verdict": ("patch", "Verdict"),
    "affected": ("versions", "affected"),
    "applied": ("reporting", "applied"),
    "dist_version": ("versions", "dist_version"),
    "gate": ("versions", "gate"),
    "guarded": ("fallback", "guarded"),
    "install": ("lifecycle", "install"),
    "instance_overrides": ("patcher", "instance_overrides"),
    "markers": ("patcher", "markers"),
    "needed": ("patch", "needed"),
    "not_needed": ("patch", "not_needed"),
    "raw_attribute": ("patcher", "raw_attribute"),
    "register": ("state", "register"),
    "registry": ("state", "registry"),
    "report": ("reporting", "report"),
    "revert": ("lifecycle", "revert"),
    "stacking": ("lifecycle", "stacking"),
    "status": ("reporting", "status"),
    "strict": ("settings", "strict"),
    "switched_on": ("settings", "switch"),
    "undecided": ("patch", "undecided"),
    "unregister": ("lifecycle", "unregister"),
    "warn_once": ("logs", "warn_once"),
}

__all__ = [
    "APPLIED",
    "CONFLICT",
    "DISABLED",
    "FAILED",
    "MARKER",
    "NOT_NEEDED",
    "PENDING",
    "REVERTED",
    "TARGET_MISSING",
    "UNDECIDED",
    "UNKNOWN_VERSION",
    "AlreadyPatched",
    "Patch",
    "PatchStatus",
    "Patcher",
    "SourceUnavailable",
    "TrlCompatError",
    "UndeclaredChange",
    "UnknownPatchId",
    "Verdict",
    "affected",
    "applied",
    "dist_version",
    "gate",
    "guarded",
    "install",
    "instance_overrides",
    "markers",
    "needed",
    "not_needed",
    "raw_attribute",
    "register",
    "registry",
    "report",
    "revert",
    "stacking",
    "status",
    "strict",
    "switched_on",
    "undecided",
    "unregister",
    "warn_once",
]


def __getattr__(name: str) -> object:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    __import__(f"{__name__}.{module}")
    value = getattr(sys.modules[f"{__name__}.{module}"], attribute)
    globals()[name] = value
    return value
