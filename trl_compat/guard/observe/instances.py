"""Wrappers set on single objects (a vLLM engine, its model, a TRL trainer or vLLM client), undone
by :func:`undo_all`.

Not the engine's :class:`~trl_compat._engine.Patcher`: it keeps what it changed alive to undo it,
and an engine (a real one holds its KV cache) or a trainer must be freed when the user drops it.
Here the objects are held weakly. An instance attribute shadows the class's, and each wrapper
looks the class's method up at call time, so whatever the patches do to the class, and their
revert and re-apply, stays in effect underneath.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any, Callable

from trl_compat.guard._mode import active

_lock = threading.Lock()
_set: weakref.WeakKeyDictionary[Any, list[str]] = weakref.WeakKeyDictionary()
_undo: list[Callable[[], None]] = []
MARK = "__trl_compat_guard__"


def instrumented(obj: Any) -> bool:
    with _lock:
        return obj in _set


def wrap_method(obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> bool:
    """Set ``obj.name`` to ``make(call)``, where ``call(*args, **kwargs)`` calls the class's
    ``name`` on ``obj`` as it is at call time. False (nothing set) if ``obj`` has no such method."""
    if not callable(getattr(type(obj), name, None)):
        return False
    ref = weakref.ref(obj)

    def call(*args: Any, **kwargs: Any) -> Any:
        target = ref()
        if target is None:  # the wrapper outlived its object: nothing to call
            raise ReferenceError(f"{name}: the object was freed")
        return getattr(type(target), name)(target, *args, **kwargs)

    hooked = make(call)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # switched off (disable(), or paused): straight through, the wrapper stays until undone
        return hooked(*args, **kwargs) if active() else call(*args, **kwargs)

    try:
        setattr(wrapper, MARK, True)
    except (AttributeError, TypeError):
        pass
    with _lock:
        setattr(obj, name, wrapper)
        _set.setdefault(obj, []).append(name)
    return True


def on_undo(undo: Callable[[], None]) -> None:
    with _lock:
        _undo.append(undo)


def undo_all() -> None:
    with _lock:
        items: dict[Any, list[str]] = dict(_set.items())
        _set.clear()
        undos, _undo[:] = list(_undo), []
    for obj, names in items.items():
        for name in names:
            if getattr(vars(obj).get(name), MARK, False):
                delattr(obj, name)
    for undo in reversed(undos):
        undo()
