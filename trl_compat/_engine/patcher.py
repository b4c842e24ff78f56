"""The one way a patch changes anything: a :class:`Patcher` records every change, so that it
can be undone exactly, and marks every value it sets with the patch's id, so that a second
copy of trl_compat (vendored and installed, or reloaded) never wraps twice. Made with the
patch's declared ``changes``, it refuses any other attribute (:class:`UndeclaredChange`)."""

from __future__ import annotations

import contextlib
import sys

from trl_compat._engine import logs, targets

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any, Callable

log = logs.getLogger(__name__)

MARKER = "__trl_compat_patch__"

_MISSING = object()


class AlreadyPatched(RuntimeError):
    """The attribute already carries this patch: another copy of trl_compat applied it."""


class UndeclaredChange(RuntimeError):
    """A patch asked to change an attribute that its registry entry's ``changes`` do not list."""


def markers(value: Any) -> frozenset:
    """The ids of the patches whose wrappers ``value`` is (or sits on top of)."""
    found = getattr(getattr(value, "__func__", value), MARKER, ())
    return frozenset(found) if isinstance(found, (set, frozenset, tuple, list)) else frozenset({found})


def raw_attribute(owner: Any, name: str) -> Any:
    """``name`` as stored in the first ``__dict__`` along ``owner``'s MRO (a module's own
    ``__dict__``): descriptors such as staticmethod and classmethod come back as they are."""
    for holder in owner.__mro__ if isinstance(owner, type) else (owner,):
        if name in vars(holder):
            return vars(holder)[name]
    raise AttributeError(f"{getattr(owner, '__name__', owner)!r} has no attribute {name!r}")


class Patcher:
    """Records every change a patch makes, so it can be undone exactly.

    ``changes``: the absolute ``"module:Qual.name"`` attributes the patch declares
    (:func:`.targets.declared`); every verb that sets an attribute refuses any other one
    (matched by the owner's identity and the name, see :mod:`.targets`). None: any attribute
    (a Patcher made by hand in a test)."""

    def __init__(self, patch_id: str, changes: Iterable[str] | None = None):
        self.patch_id = patch_id
        self.declared = None if changes is None else tuple(changes)
        self._allowed = [] if self.declared is None else targets.resolve_changes(self.declared)
        self._changes: list[tuple] = []

    def allows(self, owner: Any, name: str) -> bool:
        """Whether the declared changes list ``owner.name`` (always, without a declaration)."""
        if self.declared is None:
            return True
        if not any(o is owner and n == name for o, n in self._allowed):
            # the apply may have imported a declared attribute's module itself since
            self._allowed = targets.resolve_changes(self.declared)
        return any(o is owner and n == name for o, n in self._allowed)

    def _check(self, owner: Any, name: str) -> None:
        if not self.allows(owner, name):
            raise UndeclaredChange(
                f"{self.patch_id} may not change {_qualified(owner, name)}: its `changes` list "
                f"{', '.join(self.declared or ()) or 'nothing'}"
            )

    def wrap(self, owner: Any, name: str, factory: Callable[[Any], Any]) -> Any:
        """Set ``owner.name = factory(original)``, where ``original`` is the function found
        along the MRO; a staticmethod or classmethod is unwrapped for the factory and its
        result re-wrapped the same way. Returns what was set."""
        self._check(owner, name)
        raw = raw_attribute(owner, name)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        new = factory(raw.__func__ if kind else raw)
        return self.replace(owner, name, kind(new) if kind else new, above=raw)

    def replace(self, owner: Any, name: str, new: Any, above: Any = _MISSING) -> Any:
        """Set ``owner.name = new`` and return it. ``new`` is marked with this patch's id
        (plus the ids of the wrappers it sits ``above``); an attribute already marked with
        it raises :class:`AlreadyPatched`. Undo deletes what was inherited instead of
        re-setting it."""
        self._check(owner, name)
        current = vars(owner).get(name, _MISSING)
        if self.patch_id in markers(current) and not any(c[0] is owner and c[1] == name for c in self._changes):
            raise AlreadyPatched(f"{_qualified(owner, name)} already carries {self.patch_id}")
        # functools.wraps copied the wrapped function's marker onto ``new``: keep that chain
        carried = markers(above if above is not _MISSING else new)
        if callable(new) or isinstance(new, (staticmethod, classmethod)):
            try:
                setattr(getattr(new, "__func__", new), MARKER, carried | {self.patch_id})
            except (AttributeError, TypeError):  # builtins, slots
                pass
        setattr(owner, name, new)
        self._changes.append((owner, name, current, new))
        return new

    def on_undo(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the patch is reverted or rolled back (state that is no attribute)."""
        self._changes.append((None, None, undo, None))

    def owners(self) -> list[Any]:
        """The modules and classes whose attributes this patch set."""
        return list({id(o): o for o, _, _, _ in self._changes if o is not None}.values())

    def changed(self) -> list[str]:
        """The attributes this patch set, as dotted names (the report's target)."""
        return list(dict.fromkeys(_qualified(o, n) for o, n, _, _ in self._changes if o is not None))

    def undo(self) -> None:
        while self._changes:
            owner, name, old, new = self._changes.pop()
            if owner is None:
                old()
                continue
            current = vars(owner).get(name, _MISSING)
            if current is not new:
                # Someone replaced our value after us; putting the old one
                # back would silently drop their change.
                log.warning(
                    "trl_compat: %s: %s.%s was replaced after %s patched it; left as it is",
                    self.patch_id,
                    getattr(owner, "__name__", owner),
                    name,
                    self.patch_id,
                )
                continue
            if old is _MISSING:
                delattr(owner, name)  # was inherited: re-setting would shadow the base
            else:
                setattr(owner, name, old)


def _qualified(owner: Any, name: str) -> str:
    if isinstance(owner, type(sys)):  # a module
        return f"{owner.__name__}.{name}"
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', type(owner).__name__)}.{name}"


@contextlib.contextmanager
def instance_overrides(obj: Any, **attributes: Any):
    """For the block only: ``attributes`` set on ``obj`` itself (over its class's), then exactly what
    the instance held put back (a name it did not hold is deleted again). For a change that lives for
    one call of a wrapper the Patcher set, which the Patcher's records (made at apply, undone at
    revert) need not hold: it is gone when the call returns or raises."""
    held = vars(obj)
    saved = {name: held[name] for name in attributes if name in held}
    held.update(attributes)
    try:
        yield obj
    finally:
        for name in attributes:
            if name in saved:
                held[name] = saved[name]
            else:
                held.pop(name, None)
