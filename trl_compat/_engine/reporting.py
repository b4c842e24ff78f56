"""What the engine tells: ``report()`` (one :class:`PatchStatus` per patch, as ``python -m
trl_compat`` prints it), ``status(id)`` and ``applied()``. An applied patch's reason also says
what has changed around it since: its class replaced, or overridden in a subclass."""

from __future__ import annotations

import sys

from trl_compat._engine.patch import APPLIED, PatchStatus
from trl_compat._engine.state import REGISTRY
from trl_compat._engine.targets import declared, foreign_owner

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from types import ModuleType

    from trl_compat._engine.patch import Patch
    from trl_compat._engine.state import PatchState


def report() -> list[PatchStatus]:
    """One :class:`PatchStatus` per registered patch, in registration order."""
    with REGISTRY.lock:
        return [_status_of(patch, REGISTRY.state(patch.id)) for patch in REGISTRY.patches()]


def _status_of(patch: Patch, state: PatchState) -> PatchStatus:
    return PatchStatus(
        id=patch.id,
        status=state.status,
        reason=_reason_now(patch, state),
        versions=state.versions,
        target=", ".join(state.changed) or f"{patch.trigger}.{patch.must_exist}",
        changes=declared(patch),
        summary=patch.summary,
        upstream=patch.upstream,
    )


class UnknownPatchId(KeyError):
    """A patch id no registered patch has; the message names the close matches."""

    __module__ = "trl_compat"  # where users import it from: tracebacks name the public path

    def __str__(self) -> str:  # KeyError's would show the message as a quoted repr
        return str(self.args[0])


def checked_ids(caller: str, ids: Sequence[object]) -> list[str]:
    """``ids`` as given to ``install``/``revert``/``status``: each a registered patch id, else a
    ``TypeError`` (a list passed as one argument) or :class:`UnknownPatchId`."""
    for pid in ids:
        if not isinstance(pid, str):
            if caller == "status":
                raise TypeError(f"trl_compat.status() takes one patch id, a string; got {type(pid).__name__} {pid!r}")
            hint = f"trl_compat.{caller}(*ids)" if isinstance(pid, (list, tuple, set, frozenset)) else None
            raise TypeError(
                f"trl_compat.{caller}() takes patch ids as separate string arguments, got {type(pid).__name__} "
                f"{pid!r}" + (f"; to pass a list, unpack it: {hint}" if hint else "")
            )
    unknown = [pid for pid in ids if pid not in REGISTRY]
    if unknown:
        from trl_compat._engine.settings import close_matches

        raise UnknownPatchId(
            f"unknown trl_compat patch id{'s' if len(unknown) > 1 else ''} "
            f"{'; '.join(close_matches(str(pid), REGISTRY) for pid in unknown)}; `python -m trl_compat` lists them all"
        )
    return list(ids)  # type: ignore[arg-type]


def status(patch_id: str) -> str:
    checked_ids("status", (patch_id,))
    return REGISTRY.state(patch_id).status


def applied() -> list[str]:
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
        reason += f"; overridden in {', '.join(overriding)}: the fix reaches those only through super()"
    # What the patch has seen since it was applied (its impl module is loaded by then), e.g. the
    # model classes it decided for: its probe could only read a reference.
    details = getattr(sys.modules.get(patch.impl), "report_details", None) if patch.impl else None
    said = details() if details is not None else ""
    if said:
        reason += f"; {said}"
    return reason


def _overriding_subclasses(patch: Patch, module: ModuleType) -> list[str]:
    """Subclasses that define the patched method themselves: the fix reaches them only via super()."""
    owner_name, _, attr = patch.must_exist.partition(".")
    owner = getattr(module, owner_name, None)
    if not attr or "." in attr or not isinstance(owner, type):
        return []
    found: list[str] = []
    todo: list[type] = list(owner.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if attr in vars(cls):
            found.append(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(set(found))
