"""What the engine tells: ``report()`` (one :class:`PatchStatus` per patch, as ``python -m
trl_compat`` prints it), ``status(id)`` and ``applied()``. An applied patch's reason also says
what has changed around it since: its class replaced, or overridden in a subclass."""

from __future__ import annotations

from trl_compat._engine.lifecycle import _foreign_owner
from trl_compat._engine.patch import APPLIED, PatchStatus
from trl_compat._engine.state import _lock, _registry, _states

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import List

    from trl_compat._engine.patch import Patch
    from trl_compat._engine.state import _State


def report() -> List[PatchStatus]:
    with _lock:
        return [
            PatchStatus(
                id=p.id, status=_states[p.id].status, reason=_reason_now(p, _states[p.id]),
                versions=dict(_states[p.id].versions),
                target=", ".join(_states[p.id].changed) or f"{p.trigger}.{p.must_exist}",
                summary=p.summary, upstream=p.upstream,
            )
            for p in _registry.values()
        ]


def status(patch_id: str) -> str:
    return _states[patch_id].status


def applied() -> List[str]:
    with _lock:
        return [pid for pid, s in _states.items() if s.status == APPLIED]


def _reason_now(patch: Patch, state: _State) -> str:
    """The recorded reason, plus what has changed around an applied patch since."""
    reason = state.reason
    if state.status != APPLIED or state.module is None:
        return reason
    foreign = _foreign_owner(patch, state.module)
    if foreign:
        owner = patch.must_exist.split(".")[0]
        reason += f"; but {owner} has since been replaced by {foreign}, which the patch does not reach"
    overriding = _overriding_subclasses(patch, state.module)
    if overriding:
        reason += (f"; overridden in {', '.join(overriding)}: the fix reaches those only through super()")
    return reason


def _overriding_subclasses(patch: Patch, module: ModuleType) -> List[str]:
    """Subclasses that define the patched method themselves: the fix reaches them only via super()."""
    owner_name, _, attr = patch.must_exist.partition(".")
    owner = getattr(module, owner_name, None)
    if not attr or "." in attr or not isinstance(owner, type):
        return []
    found, todo = [], list(owner.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if attr in vars(cls):
            found.append(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(set(found))
