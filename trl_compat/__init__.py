"""trl_compat: version-gated, feature-probed fixes for known bugs of TRL's
GRPOTrainer on pinned stacks.

``import trl_compat`` (before or after ``import trl``) is all it takes. Each
patch applies only where its bug is really present; see ``python -m trl_compat``.
This module imports neither torch, transformers nor trl.
"""

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
    install,
    register,
    report,
    revert,
    status,
    strict,
)
from trl_compat.patches import PATCHES

__version__ = "0.1.0"

__all__ = [
    "APPLIED", "CONFLICT", "DISABLED", "FAILED", "NOT_NEEDED", "PENDING", "REVERTED", "TARGET_MISSING",
    "UNDECIDED", "UNKNOWN_VERSION", "Patch", "PatchStatus", "TrlCompatError", "applied",
    "install", "report", "revert", "status", "__version__",
]

for _patch in PATCHES:
    register(_patch)

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
