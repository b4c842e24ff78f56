"""vllm-sleep-mode-weights: colocate + sleep mode, vLLM generates from garbage or checkpoint weights.

Upstream: no 0.x release fixes it; PR #5313's ``_llm_weights_sleeping`` flag does, first in TRL
1.10.0 (1.0.0 - 1.9.2 carry the 0.28 code); the same idea in PR #5355 was closed.

The bug (TRL #5312, vllm#29341, #5142): with ``use_vllm=True``, ``vllm_mode="colocate"`` and
``vllm_enable_sleep_mode=True``, TRL puts its in-process ``vllm.LLM`` to sleep at level 2 after
building it and after every generation. Level 2 *discards* the weights (level 1, TRL 0.23.0 -
0.24.0, offloads and restores them: correct). What the next generation samples from then depends
on the release:

- 0.25.0 - 0.25.1 (PR #4296, 712f6a9c4): ``wake_up(tags=["weights"])`` and a sync only
  ``if self.state.global_step != self._last_loaded_step``: any generation at an unchanged step
  (every eval batch after the first, ``steps_per_generation < gradient_accumulation_steps``)
  runs on discarded memory (garbage), and what the per-parameter sync does not write (buffers)
  stays garbage ("gibberish outputs", vllm#29341).
- 0.26.0 - 0.27.2 (PR #4571, 7856d3b1f): the wake is followed by ``collective_rpc("reload_weights")``
  (the checkpoint, from disk), then the same step-gated sync: a generation at an unchanged step
  samples from the *original checkpoint*.
- 0.28.0 - 0.29.1 (PR #4700 moved generation to ``trl/generation/vllm_generation.py``): the
  trainer calls ``VLLMGeneration.sync_weights()`` and then ``generate()``, whose first act is
  wake + ``reload_weights``: every sync is overwritten from disk and vLLM *always* samples from the
  checkpoint (#5312: importance-sampling ratio ~1e-7, loss 0). 0.28.0 also syncs into the
  still-sleeping memory (#5142; 0.29.0's PR #5147 wakes first but keeps the reload in
  ``generate``). 1.0.0 - 1.9.2 (1.9.1 and 1.9.2 only as wheels) and the main-branch builds
  between them carry the same code unchanged, in the same places.

Fixed by PR #5313 (``_llm_weights_sleeping``: ``generate`` syncs when the weights were discarded
instead of reloading from disk), first released in 1.10.0 (the same idea in PR #5355 was closed).

Probe: reads TRL's generation code. 0.28+ variant: ``VLLMGeneration.generate`` calls
``collective_rpc("reload_weights")`` after ``wake_up`` and ``GRPOTrainer._generate_single_turn``
calls ``sync_weights()`` before ``vllm_generation.generate(``. 0.26 variant:
``GRPOTrainer._generate_single_turn`` sleeps at level 2 and reloads before its
``_last_loaded_step`` test. 0.25 variant: it sleeps at level 2 and never reloads. Code that
knows PR #5313's ``_llm_weights_sleeping``, or never sleeps at level 2, gives "not needed";
level-2 sleep code of another shape gives "undecided".

Fix (PR #5313's idea, as a small state machine on the engine TRL builds): after
``GRPOTrainer.__init__`` the trainer's colocated ``LLM`` (``self.llm``, or
``self.vllm_generation.llm`` from 0.28) is registered, asleep with invalid weights (TRL's
``__init__`` ends with ``sleep(level=2)``). ``vllm.LLM.sleep``, ``wake_up`` and ``collective_rpc``
are wrapped on the class and act only on registered engines:

- ``sleep(level >= 2)`` marks the weights invalid and sets the trainer's ``_last_loaded_step`` to
  -1, so the next generation always syncs, whatever the step;
- ``wake_up`` of the weights, while they are invalid, reloads the checkpoint
  (``collective_rpc("reload_weights")``, which also restores the buffers a sync does not write,
  vllm#29341), and the forced sync then writes the trained weights over it;
- ``collective_rpc("reload_weights")`` is a no-op once the weights were reloaded or synced since
  the last level-2 sleep: TRL's own reload never overwrites a sync;
- a sync (``GRPOTrainer._move_model_to_vllm`` up to 0.27, ``VLLMGeneration.sync_weights`` from
  0.28) marks the weights loaded; on 0.28.0, whose ``sync_weights`` does not wake the engine,
  the weights are woken first (as 0.29.0 does).

vLLM then generates from the weights of the last sync, at every generation. The price: a sync at
every generation (also at an unchanged step), as sleep level 2 discards the weights each time. A
reload TRL's backend does not implement (``NotImplementedError``, vllm-ascend) is skipped: the
forced sync still follows. Unregistered engines (server mode, no sleep mode, a user's own ``LLM``)
run vLLM's code unchanged.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.10 (0.25.0 - 1.9.2: no earlier release fixes it)
(the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import weakref

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, normalise
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

RELOAD = 'collective_rpc("reload_weights")'
FIXED_MARKER = "_llm_weights_sleeping"

# engine -> _State, for the engines of patched trainers only
_STATES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _State:
    __slots__ = ("trainer", "asleep", "loaded")

    def __init__(self, trainer) -> None:
        self.trainer = weakref.ref(trainer)
        self.asleep = True  # TRL's __init__ ends with sleep(level=2)
        self.loaded = False  # weights reloaded or synced since the last level-2 sleep


def _generation_class(module):
    cls = getattr(module, "VLLMGeneration", None)
    return cls if isinstance(cls, type) and callable(getattr(cls, "generate", None)) else None


def _before(text: str, first: str, second: str) -> bool:
    """Whether ``first`` occurs in the normalised code ``text``, and first before ``second``."""
    return first in text and second in text and text.index(normalise(first)) < text.index(normalise(second))


def variant(module):
    """``("0.28", reason)``, ``("0.26", ...)``, ``("0.25", ...)``, or ``(None, verdict)``."""
    trainer = module.GRPOTrainer
    single = code(trainer._generate_single_turn) if callable(getattr(trainer, "_generate_single_turn", None)) else ""
    generation = _generation_class(module)
    generate = code(generation.generate) if generation is not None else ""
    sources = (code(trainer), code(generation) if generation is not None else "")
    if any(FIXED_MARKER in source for source in sources):
        return None, not_needed(f"TRL tracks level-2 sleep itself ({FIXED_MARKER}, PR #5313)")
    if not any("sleep(level=2)" in source for source in sources):
        return None, not_needed("TRL never puts vLLM to sleep at level 2 (no sleep mode, or level 1: weights kept)")
    if generation is not None and "sleep(level=2)" in generate:
        if _before(generate, 'wake_up(tags=["weights"])', RELOAD) and _before(single, "sync_weights()", "vllm_generation.generate("):
            return "0.28", "VLLMGeneration.generate reloads the checkpoint after the trainer's sync_weights()"
        return None, undecided("VLLMGeneration.generate sleeps at level 2 but does not wake+reload after the sync: unknown shape")
    if "self.llm.sleep(level=2)" in single and 'self.llm.wake_up(tags=["weights"])' in single:
        if RELOAD in single:
            if _before(single, RELOAD, "self._last_loaded_step"):
                return "0.26", "GRPOTrainer._generate_single_turn reloads the checkpoint and syncs only on a new step"
            return None, undecided("GRPOTrainer._generate_single_turn reloads after its step test: unknown shape")
        if "self._last_loaded_step" in single:
            return "0.25", "GRPOTrainer._generate_single_turn wakes level-2-slept weights and syncs only on a new step"
    return None, undecided("TRL sleeps vLLM at level 2 in code of an unknown shape")


_EFFECT = {
    "0.28": "vLLM always samples from the initial checkpoint",
    "0.26": "a generation at an unchanged step (eval, steps_per_generation) samples from the initial checkpoint",
    "0.25": "a generation at an unchanged step samples from discarded (garbage) weights",
}


def probe(module):
    kind, found = variant(module)
    if kind is None:
        return found
    return needed(
        f"{found}: with vllm_mode='colocate' and vllm_enable_sleep_mode, {_EFFECT[kind]}; the patch syncs after "
        "every level-2 sleep and keeps the reload from overwriting a sync"
    )


def _engine_of(trainer):
    llm = vars(trainer).get("llm")
    if llm is None:
        llm = getattr(getattr(trainer, "vllm_generation", None), "llm", None)
    return llm


def _register(trainer, arguments) -> None:
    args = getattr(trainer, "args", None)
    if not getattr(trainer, "use_vllm", False) or getattr(args, "vllm_mode", None) != "colocate":
        return
    if not getattr(args, "vllm_enable_sleep_mode", False):
        return
    llm = _engine_of(trainer)
    if llm is not None:
        _STATES[llm] = _State(trainer)


def _binder(original):
    signature = inspect.signature(original)

    def bind(self, args, kwargs):
        try:
            bound = signature.bind_partial(self, *args, **kwargs)
        except TypeError:
            return None
        bound.apply_defaults()
        return bound.arguments

    return bind


def _make_sleep(original):
    bind = _binder(original)

    @functools.wraps(original)
    def sleep(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = _STATES.get(self)
        arguments = bind(self, args, kwargs) if state is not None else None
        if arguments is not None:
            state.asleep = True
            if (arguments.get("level") or 1) >= 2:
                state.loaded = False
                trainer = state.trainer()
                if trainer is not None:
                    trainer._last_loaded_step = -1  # the discarded weights need a sync, whatever the step
        return result

    return sleep


def _reload(llm, state) -> None:
    try:
        llm.collective_rpc("reload_weights")
    except NotImplementedError:  # backends without reload_weights (vllm-ascend): the forced sync follows
        log.debug("vLLM backend has no reload_weights; relying on the sync that follows")


def _make_wake_up(original):
    bind = _binder(original)

    @functools.wraps(original)
    def wake_up(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state = _STATES.get(self)
        arguments = bind(self, args, kwargs) if state is not None else None
        if arguments is not None:
            tags = arguments.get("tags")
            if tags is None or "weights" in tags:
                state.asleep = False
                if not state.loaded:
                    _reload(self, state)  # restores what a sync does not write (buffers), vllm#29341
        return result

    return wake_up


def _make_collective_rpc(original):
    bind = _binder(original)

    @functools.wraps(original)
    def collective_rpc(self, *args, **kwargs):
        state = _STATES.get(self)
        arguments = bind(self, args, kwargs) if state is not None else None
        if arguments is None or arguments.get("method") != "reload_weights":
            return original(self, *args, **kwargs)
        if state.loaded:
            return []  # the weights hold a sync (or a reload) since the last level-2 sleep: keep them
        result = original(self, *args, **kwargs)
        state.loaded = True
        return result

    return collective_rpc


def _mark_synced(state) -> None:
    if state is not None:
        state.loaded = True


def _make_trainer_sync(original):
    @functools.wraps(original)
    def _move_model_to_vllm(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        llm = vars(self).get("llm")
        _mark_synced(_STATES.get(llm) if llm is not None else None)
        return result

    return _move_model_to_vllm


def _make_generation_sync(wakes_itself: bool):
    def factory(original):
        @functools.wraps(original)
        def sync_weights(self, *args, **kwargs):
            llm = getattr(self, "llm", None)
            state = _STATES.get(llm) if llm is not None else None
            if state is not None and state.asleep and not wakes_itself:
                llm.wake_up(tags=["weights"])  # 0.28.0 writes into sleeping memory (#5142); 0.29.0 wakes first
            result = original(self, *args, **kwargs)
            _mark_synced(state)
            return result

        return sync_weights

    return factory


def apply(module, patcher):
    kind, _ = variant(module)
    # the class TRL builds its engine from (vllm.LLM is defined in vllm.entrypoints.llm)
    llm_cls = getattr(sys.modules.get("vllm.entrypoints.llm"), "LLM", None)
    if llm_cls is None:
        raise RuntimeError("vllm.entrypoints.llm.LLM is not imported: nothing to attach the sleep-mode state to")
    around_init(after=_register)(module, patcher)
    patcher.wrap(llm_cls, "sleep", _make_sleep)
    patcher.wrap(llm_cls, "wake_up", _make_wake_up)
    patcher.wrap(llm_cls, "collective_rpc", _make_collective_rpc)
    if kind == "0.28":
        generation = _generation_class(module)
        wakes_itself = "wake_up" in code(generation.sync_weights)
        patcher.wrap(generation, "sync_weights", _make_generation_sync(wakes_itself))
    else:
        patcher.wrap(module.GRPOTrainer, "_move_model_to_vllm", _make_trainer_sync)
    patcher.on_undo(_STATES.clear)
