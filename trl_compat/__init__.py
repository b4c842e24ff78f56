"""trl_compat: version-gated, feature-probed fixes for known bugs of TRL's
GRPOTrainer on pinned stacks.

``import trl_compat`` (before or after ``import trl``) is all it takes. Each
patch applies only where its bug is really present; see ``python -m trl_compat``.
This module imports neither torch, transformers nor trl.

Start-up: under ``TRL_COMPAT_AUTO=1`` every Python process imports this module, most of them
never TRL. So the import only watches for TRL's: the registry, the settings and the reporting
load when ``trl`` is about to be imported (before any of its code runs, so a patch triggered by
a module TRL imports first is hooked in time), or at the first call of the API below, whichever
comes first (:func:`_load`). A ``TRL_COMPAT_*`` variable set to a value it does not accept is
told on stderr then: when trl_compat first reads it (``python -m trl_compat`` lists them too).
"""

import os
import sys

from trl_compat._engine import hooks

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trl_compat._engine import (
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
        TrlCompatError,
        UnknownPatchId,
        applied,
        report,
        status,
    )

__version__ = "0.10.1.dev0"

__all__ = [
    "APPLIED",
    "CONFLICT",
    "DISABLED",
    "FAILED",
    "NOT_NEEDED",
    "PENDING",
    "REVERTED",
    "TARGET_MISSING",
    "UNDECIDED",
    "UNKNOWN_VERSION",
    "Patch",
    "PatchStatus",
    "TrlCompatError",
    "UnknownPatchId",
    "applied",
    "install",
    "report",
    "revert",
    "status",
    "__version__",
]

# Loaded from the engine on first use (PEP 562): the statuses, the records and the readers.
# (``register`` and ``settings`` too: this module bound them by importing them before its names were lazy.)
_FROM_ENGINE = frozenset(__all__) - {"install", "revert", "__version__"} | {"strict", "register", "settings"}


def __getattr__(name: str) -> object:
    if name not in _FROM_ENGINE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    from trl_compat import _engine

    # settings is a module of the engine; every other name one of its lazy names
    value = importlib.import_module("trl_compat._engine.settings") if name == "settings" else getattr(_engine, name)
    globals()[name] = value
    return value


def install(*ids: str) -> None:
    """Gate the given patches (default: all) and hook them to their trigger modules; see
    :func:`trl_compat._engine.install`. With no ids, also trl_compat's line in the training log."""
    from trl_compat._engine import install as install_patches
    from trl_compat._engine.reporting import checked_ids
    from trl_compat.patches import GRPO_MODULE

    install_patches(*checked_ids("install", ids))
    if not ids:
        hooks.when_imported(GRPO_MODULE, _training_log_on)


def revert(*ids: str) -> None:
    """Undo the given patches (default: all); see :func:`trl_compat._engine.revert`. With no ids,
    trainers built from now on no longer get trl_compat's callback either."""
    from trl_compat._engine import revert as revert_patches
    from trl_compat._engine.reporting import checked_ids

    revert_patches(*checked_ids("revert", ids))
    if not ids and "trl_compat._helpers.training_log" in sys.modules:
        sys.modules["trl_compat._helpers.training_log"].remove()


def _training_log_on(module: object) -> None:
    from trl_compat._helpers import training_log

    training_log.add()


def _inside_trl_lazy_import() -> bool:
    # A strict failure raised while `from trl import GRPOTrainer` imports the module would reach
    # the user as TRL's "RuntimeError: Failed to import ...": hold it back, and the callback
    # raises it as TrlCompatError when the trainer is built (trl_compat/_helpers/training_log.py).
    if "trl.import_utils" not in sys.modules:
        return False
    from trl_compat._helpers import training_log

    return training_log.inside_trl_lazy_import()


def _load() -> None:
    """Register every patch, check the settings and install: once, the first time the registry
    is used (:meth:`~trl_compat._engine.state.Registry.fill_on_first_use`). A strict failure
    raises here, out of ``import trl`` or the API call that came first."""
    from trl_compat._engine import TrlCompatError, logs, register, settings, strict
    from trl_compat.patches import PATCHES

    for patch in PATCHES:
        register(patch)
    settings.check([p.id for p in PATCHES], [p.opt_in for p in PATCHES if p.opt_in])
    settings.hold_strict_when(_inside_trl_lazy_import)
    try:
        install()
    except TrlCompatError:
        raise
    except Exception:
        if strict():
            raise
        logs.getLogger(__name__).exception("trl_compat: installing patches failed; nothing was patched")
        revert()


def _fill_on_first_use(state: object) -> None:
    state.REGISTRY.fill_on_first_use(_load)  # type: ignore[attr-defined]


def _load_before_trl() -> None:
    from trl_compat._engine.state import REGISTRY

    REGISTRY.patches()  # fills it, once


# The engine's state is filled when first used; TRL's import uses it (before TRL's code runs).
hooks.when_imported("trl_compat._engine.state", _fill_on_first_use)
hooks.before_import("trl", _load_before_trl)

if os.environ.get("TRL_COMPAT_GUARD", "").strip():  # the off-policy guard: its modules load only when asked for
    from trl_compat._engine import settings as _settings

    if _settings.guard_mode() != "off":
        from trl_compat import guard as _guard

        _guard.from_environment()
