"""What the engine tells: ``report()`` (one :class:`PatchStatus` per patch, as ``python -m
trl_compat`` prints it), ``status(id)`` and ``applied()``. An applied patch's reason also says
what has changed around it since: its class replaced, or overridden in a subclass."""

from __future__ import annotations

from trl_compat._engine.patch import APPLIED, PatchStatus
from trl_compat._engine.state import REGISTRY
from trl_compat._engine.targets import declared, foreign_owner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import List

    from trl_compat._engine.patch import Patch
    from trl_compat._engine.state import PatchState


def report() -> List[PatchStatus]:
    """One :class:`PatchStatus` per registered patch, in registration order."""
    with REGISTRY.lock:
        return [_status_of(patch, REGISTRY.state(patch.id)) for patch in REGISTRY.patches()]


def _status_of(patch: Patch, state: PatchState) -> PatchStatus:
    return PatchStatus(
        id=patch.id, status=state.status, reason=_reason_now(patch, state), versions=state.versions,
        target=", ".join(state.changed) or f"{patch.trigger}.{patch.must_exist}", changes=declared(patch),
        summary=patch.summary, upstream=patch.upstream,
    )


def status(patch_id: str) -> str:
    return REGISTRY.state(patch_id).status


def applied() -> List[str]:
    return REGISTRY.with_status(APPLIED)


def _reason_now(patch: Patch, state: PatchState) -> str:
    """The recorded reason, plus what has changed around an applied patch since."""
    reason = state.reason
    if state.status != APPLIED or state.module is None:
        return reason
    foreign = foreign_owner(patch, state.module)
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
    found: List[str] = []
    todo: List[type] = list(owner.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if attr in vars(cls):
            found.append(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(set(found))
