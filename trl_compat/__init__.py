"""trl_compat: version-gated, feature-probed fixes for known bugs of TRL's
GRPOTrainer on pinned stacks.

``import trl_compat`` (before or after ``import trl``) is all it takes. Each
patch applies only where its bug is really present; see ``python -m trl_compat``.
This module imports neither torch, transformers nor trl.
"""

import sys

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
    applied,
    hooks,
    register,
    report,
    settings,
    status,
    strict,
)
from trl_compat._engine import install as _install
from trl_compat._engine import revert as _revert
from trl_compat._engine.reporting import checked_ids
from trl_compat.patches import GRPO_MODULE, PATCHES

__version__ = "0.1.0"

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
    "applied",
    "install",
    "report",
    "revert",
    "status",
    "__version__",
]


def install(*ids: str) -> None:
    """Gate the given patches (default: all) and hook them to their trigger modules; see
    :func:`trl_compat._engine.install`. With no ids, also trl_compat's line in the training log."""
    _install(*checked_ids("install", ids))
    if not ids:
        hooks.when_imported(GRPO_MODULE, _training_log_on)


def revert(*ids: str) -> None:
    """Undo the given patches (default: all); see :func:`trl_compat._engine.revert`. With no ids,
    trainers built from now on no longer get trl_compat's callback either."""
    _revert(*checked_ids("revert", ids))
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


for _patch in PATCHES:
    register(_patch)
settings.check([p.id for p in PATCHES], [p.opt_in for p in PATCHES if p.opt_in])
settings.hold_strict_when(_inside_trl_lazy_import)

try:
    install()
except TrlCompatError:
    raise
except Exception:
    if strict():
        raise
    from trl_compat._engine import logs

    logs.getLogger(__name__).exception("trl_compat: installing patches failed; nothing was patched")
    revert()

if settings.guard_mode() != "off":  # imported only when asked for: start-up cost of the default
    from trl_compat import guard as _guard

    _guard.from_environment()
