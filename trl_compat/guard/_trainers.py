"""Finding the GRPO trainer a vLLM call was made for, and instrumenting it once.

The guard hooks vLLM's public surface, not TRL's internals. The trainer is found from the call:
the first frame up the stack whose ``self`` is a TRL GRPO trainer (TRL calls vLLM from
``compute_loss``, ``_prepare_inputs``, ``_generate_and_score_completions``,
``_generate_single_turn`` or, from 0.28, ``VLLMGeneration.generate`` called from one of those).
Once found, the trainer gets the loss-side capture of :mod:`._loss`, on the instance only (the
metrics and strict mode come from the guard's callback, which every trainer of every rank has).
Instance attributes, not class ones: the patches wrap TRL's classes in an order the engine
keeps, and their revert and re-apply must never find the guard in between.
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Any, Optional

_MAX_DEPTH = 48
_seen: "weakref.WeakSet[Any]" = weakref.WeakSet()


def _is_grpo_trainer(obj: Any) -> bool:
    return any(klass.__name__ == "GRPOTrainer" and klass.__module__.startswith("trl.") for klass in type(obj).__mro__)


def calling_trainer() -> Optional[Any]:
    """The GRPO trainer whose code is on the stack (None: the call comes from elsewhere)."""
    frame: Optional[FrameType] = sys._getframe(2)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if candidate is not None and _is_grpo_trainer(candidate):
            return candidate
        frame = frame.f_back
    return None


def adopt(trainer: Any) -> None:
    """Instrument ``trainer`` once (its loss-side capture)."""
    if trainer in _seen:
        return
    _seen.add(trainer)
    from trl_compat.guard import _loss

    _loss.attach(trainer)


def sync_step(engine: Any = None) -> int:
    """The optimizer step a weight sync happens at: the global step of the GRPO trainer whose code
    makes it (TRL syncs from its own methods, or from ``VLLMGeneration.sync_weights`` called by
    them), which is then adopted; 0 (the checkpoint's weights, nothing to check) for a sync no
    trainer makes. Not the last trainer seen: an earlier run's step made a new engine's first sync
    look like one after an optimizer step (C alarms on a run's step 0, or on a bare engine).
    With ``engine`` (the guard's record of the engine synced into), the trainer found is kept
    there: TRL 0.18+ calls load_weights once per parameter, and one stack walk per sync is enough."""
    known = getattr(engine, "trainer", None)
    trainer = known() if known is not None else None
    if trainer is None:
        trainer = calling_trainer()
        if trainer is None:
            return 0
        adopt(trainer)
        if engine is not None:
            engine.trainer = weakref.ref(trainer)
    return global_step(trainer)


def global_step(trainer: Optional[Any]) -> int:
    state = getattr(trainer, "state", None)
    step = getattr(state, "global_step", None)
    return int(step) if isinstance(step, int) else 0
