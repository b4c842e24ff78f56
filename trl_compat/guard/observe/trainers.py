"""Finding the GRPO trainer a vLLM call was made for, and adopting it once: the guard's only stack
walk.

The guard hooks vLLM's public surface, not TRL's internals. The trainer is found from the call:
the first frame up the stack whose ``self`` is a TRL GRPO trainer (TRL calls vLLM from
``compute_loss``, ``_prepare_inputs``, ``_generate_and_score_completions``,
``_generate_single_turn`` or, from 0.28, ``VLLMGeneration.generate`` called from one of those).
Adopting a trainer gives it a :class:`~trl_compat.guard._run.Run`, the loss-side capture of
:mod:`.loss` (on the instance only) and its link to the guard's callback (metrics, strict mode).
Instance attributes, not class ones: the patches wrap TRL's classes in an order the engine
keeps, and their revert and re-apply must never find the guard in between.
"""

from __future__ import annotations

import sys
import weakref
from types import FrameType
from typing import Any

from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._run import Run, global_step, known_run, run_of
from trl_compat.guard.observe import callback, loss

_MAX_DEPTH = 50


def _is_grpo_trainer(obj: Any) -> bool:
    return any(klass.__name__ == "GRPOTrainer" and klass.__module__.startswith("trl.") for klass in type(obj).__mro__)


def calling_trainer() -> Any | None:
    """The GRPO trainer whose code is on the stack (None: the call comes from elsewhere)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if candidate is not None and _is_grpo_trainer(candidate):
            return candidate
        frame = frame.f_back
    return None


def adopt(trainer: Any) -> Run:
    """``trainer``'s run; made, with the trainer instrumented, the first time."""
    run = known_run(trainer)
    if run is not None:
        return run
    run = run_of(trainer)
    loss.attach(trainer, run)
    callback.link(trainer, run)
    return run


def generating(engine: EngineRecord) -> Run | None:
    """At a generate call: the run of the GRPO trainer on the stack, adopted and kept as the
    engine's (None: a generation of the user's own, eval scripts and the like)."""
    trainer = calling_trainer()
    if trainer is None:
        return None
    engine.trainer = weakref.ref(trainer)
    return adopt(trainer)


def syncing(engine: EngineRecord) -> Any:
    """The trainer a weight sync into ``engine`` comes from: the one kept on the engine, else the
    GRPO trainer whose code makes it (TRL syncs from its own methods, or from
    ``VLLMGeneration.sync_weights`` called by them), adopted and kept; None for a sync no trainer
    makes (its step is 0: the checkpoint's weights, nothing to check). Not the last trainer seen:
    an earlier run's step made a new engine's first sync look like one after an optimizer step.
    TRL 0.18+ calls load_weights once per parameter: one stack walk per engine is enough."""
    trainer = engine.driver()
    if trainer is None:
        trainer = calling_trainer()
        if trainer is None:
            return None
        adopt(trainer)
        engine.trainer = weakref.ref(trainer)
    return trainer


def step_of(trainer: Any) -> int:
    """The optimizer step ``trainer`` is at (0: no trainer)."""
    return global_step(trainer)
