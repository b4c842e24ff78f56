"""What a patch is: its declaration, what its probe may say, the statuses it can be in."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Dict, Mapping, NamedTuple, Optional

if TYPE_CHECKING:
    from trl_compat._engine.patcher import Patcher

# Statuses a patch can be in; the report shows them verbatim.
PENDING = "pending"  # in window, waiting for its trigger module to be imported
APPLIED = "applied"
NOT_NEEDED = "not needed"
DISABLED = "disabled"
UNKNOWN_VERSION = "unknown version"
UNDECIDED = "undecided"  # the probe could not tell whether the bug is there
TARGET_MISSING = "target missing"
FAILED = "failed"
CONFLICT = "conflict"  # someone else (e.g. Unsloth) replaced the class the patch targets
REVERTED = "reverted"

# Statuses that mean "a patch that may be needed could not be applied".
_TROUBLE = {UNKNOWN_VERSION, UNDECIDED, TARGET_MISSING, FAILED, CONFLICT}


class TrlCompatError(RuntimeError):
    """Raised instead of degrading quietly when ``TRL_COMPAT_STRICT=1``."""


class Verdict(NamedTuple):
    """What a probe found. ``needed`` is True, False, or None (cannot tell)."""

    needed: Optional[bool]
    reason: str


def needed(reason: str) -> Verdict:
    return Verdict(True, reason)


def not_needed(reason: str) -> Verdict:
    return Verdict(False, reason)


def undecided(reason: str) -> Verdict:
    return Verdict(None, reason)


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    upstream: str
    module: str  # importing this module triggers the patch
    target: str  # dotted path inside ``module``; must resolve before probing
    requires: Mapping[str, str]  # distribution -> PEP 440 specifier set
    probe: Callable[[ModuleType], Verdict]
    apply: Callable[[ModuleType, "Patcher"], None]
    remove_when: str = ""
    # An environment variable that must be on for the patch to apply (a fix that changes the
    # training objective): off, a patch whose probe finds the bug reports "disabled".
    opt_in: str = ""


@dataclass
class PatchStatus:
    """One line of ``report()``."""

    id: str
    status: str
    reason: str
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    target: str = ""
    summary: str = ""
    upstream: str = ""

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)
