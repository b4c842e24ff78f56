"""The registry: every patch registered, its state, the switches read from the environment,
and the one place a status is set (and logged, and raised on under ``TRL_COMPAT_STRICT=1``)."""

from __future__ import annotations

import _thread

from trl_compat._engine import logs, settings
from trl_compat._engine.patch import _TROUBLE, APPLIED, PENDING, TrlCompatError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict, List, Sequence

    from trl_compat._engine.patch import Patch

log = logs.getLogger(__name__)


class _State:
    def __init__(self) -> None:
        self.status, self.reason = PENDING, ""
        self.versions = {}  # distribution -> installed version (None: not installed)
        self.generation = 0  # bumped by revert(): hooks from older generations do nothing
        self.patcher = None  # the Patcher of the applied patch
        self.module = None  # the trigger module, once imported
        self.touched = frozenset()  # (id(owner), name) it changed when last applied; kept after revert
        self.changed = []  # the same, as dotted names, for the report


_lock = _thread.RLock()
_registry: Dict[str, Patch] = {}
_states: Dict[str, _State] = {}


def register(patch: Patch) -> None:
    with _lock:
        if patch.id in _registry and _registry[patch.id] is not patch:
            raise ValueError(f"duplicate patch id {patch.id!r}")
        _registry[patch.id] = patch
        _states.setdefault(patch.id, _State())


def registry() -> List[Patch]:
    return list(_registry.values())


def _select(ids: Sequence[str]) -> List[Patch]:
    unknown = [i for i in ids if i not in _registry]
    if unknown:
        raise KeyError(f"unknown trl_compat patch ids: {unknown}")
    return [_registry[i] for i in ids] if ids else registry()


def _position(patch: Patch) -> int:
    return list(_registry).index(patch.id)


def _unique(patches: List[Patch]) -> List[Patch]:
    return list({p.id: p for p in patches}.values())


# -- configuration --------------------------------------------------------------


def strict() -> bool:
    return settings.strict()


def switched_on(variable: str) -> bool:
    return settings.switch(variable)


def _disabled_ids() -> set:
    return settings.disabled_ids(_registry)


# -- statuses -------------------------------------------------------------------


def _set(patch: Patch, status: str, reason: str) -> None:
    state = _states[patch.id]
    state.status, state.reason = status, reason
    if status in _TROUBLE:
        log.warning("trl_compat: %s: %s (%s); this patch is skipped", patch.id, status, reason)
        if strict():
            raise TrlCompatError(f"{patch.id}: {status}: {reason}")
    else:
        log.debug("trl_compat: %s: %s (%s)", patch.id, status, reason)


def _log_summary_when_settled() -> None:
    if any(s.status == PENDING for s in _states.values()):
        return
    applied = [pid for pid, s in _states.items() if s.status == APPLIED]
    trouble = [f"{pid} ({s.status})" for pid, s in _states.items() if s.status in _TROUBLE]
    others = len(_states) - len(applied) - len(trouble)
    log.info(
        "trl_compat: applied %s; %d not needed or disabled%s (details: python -m trl_compat)",
        ", ".join(applied) or "nothing", others,
        f"; skipped: {', '.join(trouble)}" if trouble else "",
    )
