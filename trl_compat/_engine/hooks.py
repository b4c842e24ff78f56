"""Post-import hooks: run a function on a module once it is imported, at once if it already is.

What ``wrapt.register_post_import_hook`` does, in the few lines trl_compat needs (wrapt 2.x
imports asyncio, ssl and subprocess, which cost more than starting Python): a finder first on
``sys.meta_path`` notices the import of a watched module and wraps its loader, which runs the
hooks once the module's code has run. The hooks receive the module their loader executed.
A hook registered while another thread is still executing the module fires at once, as
wrapt's does; the engine's hook waits for that import itself.

:func:`before_import` runs a function when a module is about to be imported (its finder is
asked), before any of its code runs: ``import trl_compat`` loads the registry and gates the
patches only then, for ``trl``.

This module runs at interpreter start-up: no ``from __future__`` (a module import of its own),
so the annotations that name typing's types are strings.
"""

import _thread
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable

# _thread, not threading: this runs at interpreter start-up, and threading is not loaded yet there
_lock = _thread.RLock()
_hooks: "dict[str, list[Callable[[ModuleType], None]]]" = {}
_before: "dict[str, list[Callable[[], None]]]" = {}
_searching = _thread._local()  # names this thread's finder is asking the others about


def when_imported(name: str, hook: "Callable[[ModuleType], None]") -> None:
    """Call ``hook(module)`` once module ``name`` is imported; now if it is in ``sys.modules``."""
    with _lock:
        _ensure_finder()
        module = sys.modules.get(name)
        if module is None:
            _hooks.setdefault(name, []).append(hook)
    # Outside the lock, as wrapt does: the hook may import, and so need it from another thread.
    if module is not None:
        hook(module)


def before_import(name: str, function: "Callable[[], None]") -> None:
    """Call ``function()`` once, when module ``name`` is about to be imported (or found: an
    ``importlib.util.find_spec(name)`` counts); now if it is in ``sys.modules`` already. Hooks it
    registers for ``name`` itself with :func:`when_imported` still fire after that import."""
    with _lock:
        _ensure_finder()
        now = name in sys.modules
        if not now:
            _before.setdefault(name, []).append(function)
    if now:
        function()


def _ensure_finder() -> None:
    if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _Finder())


def _notify(module: "ModuleType") -> None:
    with _lock:
        hooks = _hooks.pop(module.__name__, ())
    for hook in hooks:
        hook(module)


class _Finder:
    """Finds nothing itself: asks the finders after it and wraps the loader of a watched module."""

    def find_spec(self, fullname: str, path: "Any" = None, target: "Any" = None) -> "Any":
        with _lock:
            before = _before.pop(fullname, ())
        for function in before:  # outside the lock: it may register hooks, from this thread or others
            function()
        with _lock:
            if fullname not in _hooks:
                return None
        searching = _searching.__dict__.setdefault("names", set())
        if fullname in searching:
            return None  # another copy of this finder (a second trl_compat) asked us back
        searching.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        # a Loader by duck typing; subclassing importlib.abc.Loader would import it at start-up
                        spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
                    return spec
            return None
        finally:
            searching.discard(fullname)

    def invalidate_caches(self) -> None:
        pass


class _Loader:
    """Runs the real loader, puts it back where the module records its loader, then the hooks."""

    def __init__(self, loader: "Any"):
        self._loader = loader

    def create_module(self, spec: "Any") -> "Any":
        create = getattr(self._loader, "create_module", None)
        return create(spec) if create is not None else None

    def exec_module(self, module: "ModuleType") -> None:
        if getattr(module, "__loader__", None) is self:
            module.__loader__ = self._loader
        spec = getattr(module, "__spec__", None)
        if spec is not None and spec.loader is self:
            spec.loader = self._loader
        self._loader.exec_module(module)
        _notify(module)

    @property  # type: ignore[misc]
    def __class__(self) -> type:  # isinstance(spec.loader, SourceFileLoader) holds, as with wrapt's proxy
        return type(self._loader)

    def __getattr__(self, name: str) -> "Any":  # get_source, is_package, get_resource_reader...
        if name == "_loader":
            raise AttributeError(name)
        return getattr(self._loader, name)
