"""Where a patch acts: its ``must_exist`` path, the attributes its ``changes`` declare, and the
order in which patches that change one attribute stack.

A declared change is written relative to the trigger module (``"GRPOTrainer.__init__"``) or as
``"module:Qual.name"``; :func:`absolute` normalises both to ``"module:Qual.name"``, which is what
the report shows and what stacking compares, before any module is imported.

Once the modules are imported, :func:`resolve_changes` turns each declared name into the pair
``(owner, name)``: the object the dotted path before the last part leads to (a module or a
class), and the last part. A :class:`Patcher` matches an attribute it is asked to change against
these pairs by the *identity* of the owner and the name: ``patcher.wrap(module.GRPOTrainer,
"__init__", ...)`` is allowed by ``"GRPOTrainer.__init__"`` whether or not ``GRPOTrainer``
defines ``__init__`` itself, and not by a subclass or another module's class of the same name.
A declared name whose owner does not resolve in this release (a class or module it does not
have) is simply not available to the patch; its last part need not exist yet (a patch may set
a module global that the release lacks).
"""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable
    from types import ModuleType
    from typing import Any

    from trl_compat._engine.patch import Patch


def resolve(obj: Any, dotted: str) -> Any:
    """``obj.a.b.c`` for ``dotted="a.b.c"``; AttributeError if a part is missing."""
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def foreign_owner(patch: Patch, module: ModuleType) -> str | None:
    """Name the class that replaced the module's own one (Unsloth does this), if any."""
    owner = getattr(module, patch.must_exist.split(".")[0], None)
    if isinstance(owner, type) and owner.__module__ != module.__name__:
        return f"{owner.__module__}.{owner.__qualname__}"
    return None


def absolute(name: str, trigger: str) -> str:
    """``name`` as ``"module:Qual.name"``: a name without a module is relative to ``trigger``."""
    return name if ":" in name else f"{trigger}:{name}"


def declared(patch: Patch) -> tuple[str, ...]:
    """The attributes ``patch`` declares it may change, as absolute ``"module:Qual.name"``."""
    return tuple(absolute(name, patch.trigger) for name in patch.changes)


def resolve_changes(names: Iterable[str]) -> list[tuple[Any, str]]:
    """``(owner, attribute name)`` for each absolute name whose module is imported and whose
    owner resolves; the others are not available now."""
    found = []
    for name in names:
        module_name, _, path = name.partition(":")
        module = sys.modules.get(module_name)
        owner_path, _, attr = path.rpartition(".")
        if module is None or not attr:
            continue
        try:
            owner = resolve(module, owner_path) if owner_path else module
        except AttributeError:
            continue
        found.append((owner, attr))
    return found


def stacking_order(attribute: str, patches: Iterable[Patch]) -> list[str]:
    """The ids of ``patches`` that declare ``attribute`` (absolute ``"module:Qual.name"``) in
    their ``changes``, in the order they stack: the order given (the registry's), first lowest."""
    return [patch.id for patch in patches if attribute in declared(patch)]
