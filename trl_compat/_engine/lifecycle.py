"""A patch's life: ``install()`` gates it and hooks it to its trigger module; the hook probes
the real code and applies the patch through a :class:`Patcher` that allows only the attributes
the patch declares in ``changes`` (anything else fails the patch and rolls it back);
``revert()`` undoes it. Patches whose declared ``changes`` overlap stack in registration order
(:func:`stacking`), whatever order they are installed and reverted in. The state all this
reads and sets is :data:`.state.REGISTRY`'s."""

from __future__ import annotations

from trl_compat._engine import hooks, logs, settings
from trl_compat._engine.patch import (
    ADVICE,
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
from trl_compat._engine.state import REGISTRY
from trl_compat._engine.targets import declared, foreign_owner, resolve, stacking_order
from trl_compat._engine.versions import gate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import ModuleType
    from typing import Callable

    from trl_compat._engine.patch import Patch

log = logs.getLogger(__name__)


def install(*ids: str) -> None:
    """Gate the given patches (default: all) and hook them to their trigger
    modules. Idempotent: an applied or waiting patch is left alone.

    Patches that change the same attribute always stack in registration order:
    an applied patch that belongs above one applied again here comes off first
    and goes back on after it."""
    disabled = settings.disabled_ids(REGISTRY)
    to_hook = []
    with REGISTRY.lock:
        selected = REGISTRY.select(ids)
        above = _stacked_above([p for p in selected if REGISTRY.state(p.id).patcher is None])
        for patch in sorted(above, key=REGISTRY.position, reverse=True):
            _take_off(patch, "taken off to re-apply a patch below it")
        for patch in sorted(_unique(selected + above), key=REGISTRY.position):
            state = REGISTRY.state(patch.id)
            if state.patcher is not None or (state.status == PENDING and state.generation > 0):
                continue
            if "*" in disabled or patch.id in disabled:
                REGISTRY.set_status(patch, DISABLED, "switched off by TRL_COMPAT_DISABLE")
                continue
            status, reason, state.versions = gate(patch)
            if status is not None:
                REGISTRY.set_status(patch, status, reason)
                continue
            state.generation += 1
            state.status, state.reason = PENDING, f"waiting for `import {patch.trigger}`"
            to_hook.append((patch, state.generation))

    # Outside our lock (and outside the first fill's, which holds it: REGISTRY.after_fill): the hook fires
    # right here if the module is already loaded, possibly still executing in another thread.
    def hook_triggers() -> None:
        for patch, generation in to_hook:
            hooks.when_imported(patch.trigger, _make_hook(patch.id, generation))

    if not REGISTRY.after_fill(hook_triggers):
        hook_triggers()


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
        with REGISTRY.lock:
            if patch_id not in REGISTRY:
                return  # forgotten since
            state = REGISTRY.state(patch_id)
            if state.generation != generation or state.status != PENDING:
                return  # neutralised by revert(), or already handled
            _probe_and_apply(REGISTRY.patch(patch_id), module)
        REGISTRY.log_summary_when_settled()

    return hook


def _probe_and_apply(patch: Patch, module: ModuleType) -> None:
    set_status = REGISTRY.set_status
    state = REGISTRY.state(patch.id)
    state.module = module
    try:
        resolve(module, patch.must_exist)
    except AttributeError:
        set_status(patch, TARGET_MISSING, f"{patch.trigger}.{patch.must_exist} does not exist in this release")
        return
    foreign = foreign_owner(patch, module)
    if foreign:
        # Its methods were rebuilt from TRL's source by someone else: wrapping
        # them again would patch twice, or patch code we never probed.
        set_status(patch, CONFLICT, f"{patch.trigger}.{patch.must_exist.split('.')[0]} was replaced by {foreign}; left alone")
        return
    if patch.probe is None or patch.apply is None:
        set_status(patch, FAILED, "declares a probe without an apply, or an apply without a probe")
        return
    try:
        verdict = patch.probe(module)
    except SourceUnavailable as exc:
        set_status(patch, UNDECIDED, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - a probe must never break the host
        set_status(patch, FAILED, f"probe raised {type(exc).__name__}: {exc}")
        return
    if verdict.needed is None:
        set_status(patch, UNDECIDED, verdict.reason)
        return
    if not verdict.needed:
        set_status(patch, NOT_NEEDED, verdict.reason)
        return
    if patch.kind == ADVICE:
        set_status(patch, UNDECIDED, f"{verdict.reason}; advice only: trl_compat has no fix to apply")
        return
    if patch.opt_in and not settings.switch(patch.opt_in):
        log.info("trl_compat: %s: %s; opt-in: set %s=1 to apply the fix", patch.id, verdict.reason, patch.opt_in)
        set_status(patch, DISABLED, f"opt-in, off: {verdict.reason}; set {patch.opt_in}=1 to apply the fix")
        return
    # A patch may change only what its entry declares: the Patcher refuses anything else.
    patcher = Patcher(patch.id, declared(patch))
    try:
        patch.apply(module, patcher)
    except AlreadyPatched as exc:
        # Another copy of trl_compat (vendored and installed, or reloaded): never wrap twice.
        patcher.undo()
        set_status(patch, APPLIED, f"already patched by another copy of trl_compat ({exc})")
        return
    except Exception as exc:  # noqa: BLE001 - UndeclaredChange included
        patcher.undo()
        set_status(patch, FAILED, f"apply raised {type(exc).__name__}: {exc}; changes rolled back")
        return
    state.patcher, state.changed = patcher, patcher.changed()
    set_status(patch, APPLIED, verdict.reason)


def revert(*ids: str) -> None:
    """Undo the given patches (default: all), newest first, and neutralise
    their hooks that have not fired yet. ``install()`` re-applies.

    A patch stacked above one of them (it changes the same attribute) comes off
    first and is applied again afterwards, on what is left: undoing only the
    lower one would leave it half in place under the upper one."""
    with REGISTRY.lock:
        chosen = REGISTRY.select(ids)
        above = _stacked_above(chosen)
        for patch in sorted(_unique(chosen + above), key=REGISTRY.position, reverse=True):
            _take_off(patch, "reverted by trl_compat.revert()")
    if above:
        install(*(p.id for p in above))


def unregister(patch_id: str) -> None:
    """Revert and forget a patch (for tests that register their own)."""
    with REGISTRY.lock:
        if patch_id in REGISTRY:
            revert(patch_id)
            REGISTRY.forget(patch_id)


def stacking(attribute: str) -> list[str]:
    """The ids of the registered patches whose ``changes`` include ``attribute`` (absolute:
    ``"trl.trainer.grpo_trainer:GRPOTrainer.__init__"``), lowest first: the order they stack in,
    whatever order they are installed and reverted in."""
    return stacking_order(attribute, REGISTRY.patches())


def _unique(patches: list[Patch]) -> list[Patch]:
    return list({p.id: p for p in patches}.values())


def _take_off(patch: Patch, reason: str) -> None:
    state = REGISTRY.state(patch.id)
    state.generation += 1
    if state.patcher is not None:
        state.patcher.undo()
        state.patcher = None
        state.status, state.reason = REVERTED, reason
    elif state.status == PENDING:
        state.status, state.reason = REVERTED, "reverted before its trigger module was imported"


def _stacks_on(lower: Patch, upper: Patch) -> bool:
    """Whether ``upper`` (applied, registered after ``lower``) declares an attribute ``lower``
    declares, so that it must come off before ``lower`` is taken off or put on again."""
    return not set(declared(lower)).isdisjoint(declared(upper))


def _stacked_above(moving: list[Patch]) -> list[Patch]:
    """Applied patches, other than ``moving``, registered after one of them and stacking on it
    (:func:`_stacks_on`), and in turn those above them."""
    below = list(moving)
    seen = {p.id for p in moving}
    above: list[Patch] = []
    grew = True
    while grew:
        grew = False
        for patch in REGISTRY.patches():
            if patch.id in seen or REGISTRY.state(patch.id).patcher is None:
                continue
            position = REGISTRY.position(patch)
            if any(REGISTRY.position(low) < position and _stacks_on(low, patch) for low in below):
                above.append(patch)
                below.append(patch)
                seen.add(patch.id)
                grew = True
    return above
