"""A patch's life: ``install()`` gates it and hooks it to its trigger module; the hook probes
the real code and applies the patch through a :class:`Patcher`; ``revert()`` undoes it.
Patches that change the same attribute stack in registration order, whatever order they are
installed and reverted in."""

from __future__ import annotations

from trl_compat._engine import hooks, logs
from trl_compat._engine.patch import (
    APPLIED,
    CONFLICT,
    DISABLED,
    FAILED,
    NOT_NEEDED,
    PENDING,
    REVERTED,
    TARGET_MISSING,
    UNDECIDED,
    SourceUnavailable,
)
from trl_compat._engine.patcher import AlreadyPatched, Patcher
from trl_compat._engine.state import (
    _disabled_ids,
    _lock,
    _log_summary_when_settled,
    _position,
    _registry,
    _select,
    _set,
    _states,
    _unique,
    registry,
    switched_on,
)
from trl_compat._engine.versions import gate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Any, Callable, List, Optional

    from trl_compat._engine.patch import Patch

log = logs.getLogger(__name__)


def install(*ids: str) -> None:
    """Gate the given patches (default: all) and hook them to their trigger
    modules. Idempotent: an applied or waiting patch is left alone.

    Patches that change the same attribute always stack in registration order:
    an applied patch that belongs above one applied again here comes off first
    and goes back on after it."""
    disabled = _disabled_ids()
    to_hook = []
    with _lock:
        selected = _select(ids)
        above = _stacked_above([p for p in selected if _states[p.id].patcher is None])
        for patch in sorted(above, key=_position, reverse=True):
            _take_off(patch, "taken off to re-apply a patch below it")
        for patch in sorted(_unique(selected + above), key=_position):
            state = _states[patch.id]
            if state.patcher is not None or (state.status == PENDING and state.generation > 0):
                continue
            if "*" in disabled or patch.id in disabled:
                _set(patch, DISABLED, "switched off by TRL_COMPAT_DISABLE")
                continue
            status, reason, state.versions = gate(patch)
            if status is not None:
                _set(patch, status, reason)
                continue
            state.generation += 1
            state.status, state.reason = PENDING, f"waiting for `import {patch.trigger}`"
            to_hook.append((patch, state.generation))
    # Outside our lock: the hook fires right here if the module is already loaded.
    for patch, generation in to_hook:
        hooks.when_imported(patch.trigger, _make_hook(patch.id, generation))


def _make_hook(patch_id: str, generation: int) -> Callable[[ModuleType], None]:
    def hook(module: ModuleType) -> None:
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            # The hook fires as soon as the module is in sys.modules, possibly while
            # another thread is still executing it. import_module waits for that
            # thread (outside our lock: it may need our lock for its own hooks).
            import importlib

            try:
                module = importlib.import_module(module.__name__)
            except Exception:  # noqa: BLE001 - its import failed: nothing to patch
                return
        with _lock:
            state = _states[patch_id]
            if state.generation != generation or state.status != PENDING:
                return  # neutralised by revert(), or already handled
            _resolve(_registry[patch_id], module)
            _log_summary_when_settled()

    return hook


def _resolve_target(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _foreign_owner(patch: Patch, module: ModuleType) -> Optional[str]:
    """Name the class that replaced the module's own one (Unsloth does this), if any."""
    owner = getattr(module, patch.must_exist.split(".")[0], None)
    if isinstance(owner, type) and owner.__module__ != module.__name__:
        return f"{owner.__module__}.{owner.__qualname__}"
    return None


def _resolve(patch: Patch, module: ModuleType) -> None:
    _states[patch.id].module = module
    try:
        _resolve_target(module, patch.must_exist)
    except AttributeError:
        _set(patch, TARGET_MISSING, f"{patch.trigger}.{patch.must_exist} does not exist in this release")
        return
    foreign = _foreign_owner(patch, module)
    if foreign:
        # Its methods were rebuilt from TRL's source by someone else: wrapping
        # them again would patch twice, or patch code we never probed.
        _set(patch, CONFLICT, f"{patch.trigger}.{patch.must_exist.split('.')[0]} was replaced by {foreign}; left alone")
        return
    try:
        verdict = patch.probe(module)
    except SourceUnavailable as exc:
        _set(patch, UNDECIDED, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - a probe must never break the host
        _set(patch, FAILED, f"probe raised {type(exc).__name__}: {exc}")
        return
    if verdict.needed is None:
        _set(patch, UNDECIDED, verdict.reason)
        return
    if not verdict.needed:
        _set(patch, NOT_NEEDED, verdict.reason)
        return
    if patch.opt_in and not switched_on(patch.opt_in):
        log.info("trl_compat: %s: %s; opt-in: set %s=1 to apply the fix", patch.id, verdict.reason, patch.opt_in)
        _set(patch, DISABLED, f"opt-in, off: {verdict.reason}; set {patch.opt_in}=1 to apply the fix")
        return
    patcher = Patcher(patch.id)
    try:
        patch.apply(module, patcher)
    except AlreadyPatched as exc:
        # Another copy of trl_compat (vendored and installed, or reloaded): never wrap twice.
        patcher.undo()
        _set(patch, APPLIED, f"already patched by another copy of trl_compat ({exc})")
        return
    except Exception as exc:  # noqa: BLE001
        patcher.undo()
        _set(patch, FAILED, f"apply raised {type(exc).__name__}: {exc}; changes rolled back")
        return
    state = _states[patch.id]
    state.patcher, state.touched, state.changed = patcher, patcher.touched(), patcher.changed()
    _set(patch, APPLIED, verdict.reason)


def revert(*ids: str) -> None:
    """Undo the given patches (default: all), newest first, and neutralise
    their hooks that have not fired yet. ``install()`` re-applies.

    A patch stacked above one of them (it wraps the same attribute) comes off
    first and is applied again afterwards, on what is left: undoing only the
    lower one would leave it half in place under the upper one."""
    with _lock:
        chosen = _select(ids)
        above = _stacked_above(chosen)
        for patch in sorted(_unique(chosen + above), key=_position, reverse=True):
            _take_off(patch, "reverted by trl_compat.revert()")
    if above:
        install(*(p.id for p in above))


def unregister(patch_id: str) -> None:
    """Revert and forget a patch (for tests that register their own)."""
    with _lock:
        if patch_id in _registry:
            revert(patch_id)
            del _registry[patch_id]
            del _states[patch_id]


def _take_off(patch: Patch, reason: str) -> None:
    state = _states[patch.id]
    state.generation += 1
    if state.patcher is not None:
        state.patcher.undo()
        state.patcher = None
        state.status, state.reason = REVERTED, reason
    elif state.status == PENDING:
        state.status, state.reason = REVERTED, "reverted before its trigger module was imported"


def _stacked_above(moving: List[Patch]) -> List[Patch]:
    """Applied patches, other than ``moving``, registered after one of them and
    changing an attribute it changes (or changed when last applied), and in
    turn those above them. A moving patch never applied yet may change anything
    of its trigger module: every later patch applied there counts as above it
    (taking one off and on again costs a re-wrap; wrapping above it would not
    stack in registration order)."""
    moving_ids = {p.id for p in moving}
    below = [(_position(p), _states[p.id].touched, None if _states[p.id].touched else p.trigger) for p in moving]
    above: List[Patch] = []
    grew = True
    while grew:
        grew = False
        for patch in registry():
            state = _states[patch.id]
            if patch.id in moving_ids or patch in above or state.patcher is None:
                continue
            if any(pos < _position(patch) and (state.touched & touched or module == patch.trigger)
                   for pos, touched, module in below):
                above.append(patch)
                below.append((_position(patch), state.touched, None))
                grew = True
    return above
