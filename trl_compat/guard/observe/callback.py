"""The guard in the training loop, through transformers' callbacks (in ``DEFAULT_CALLBACKS``, so
every trainer of every rank has it, whether or not that rank calls vLLM):

* ``on_log``: the run's ``offpolicy/*`` figures since the last log join the logged metrics (W&B,
  TensorBoard and ``state.log_history`` get them), for GRPO trainers with ``use_vllm``;
* ``on_step_end``, strict mode: one ``all_reduce(MAX)`` of "this rank alarmed", then
  :class:`OffPolicyError` on every rank if any did. Every rank ends every optimizer step, so the
  collective never waits for a rank that will not come.

Each trainer has its own instance of the callback; adopting a trainer links that instance to the
trainer's run (:func:`link`), whose figures and L batches it takes.
"""

from __future__ import annotations

import functools
import statistics
import sys
import weakref
from typing import Any

from trl_compat._engine import guarded
from trl_compat.guard._ledger import LEDGER, error_for
from trl_compat.guard._mode import GUARD_ID, active, is_strict
from trl_compat.guard._run import Run
from trl_compat.guard.checks import logprobs

PREFIX = "offpolicy/"
# figures summed over the logging window; the rest are averaged
SUMMED = ("alarm", "rows_checked", "prompt_mismatch_rows")
RUN = "_trl_compat_guard_run"  # the callback instance's attribute: a weak reference to its trainer's run


def _guarded_args(args: Any) -> bool:
    return bool(getattr(args, "use_vllm", False)) and type(args).__name__.startswith("GRPOConfig")


def metrics(figures: dict[str, list[float]]) -> dict[str, float]:
    out = {PREFIX + "alarm": float(bool(figures.get("alarm")))}
    for name, values in figures.items():
        if name == "alarm" or not values:
            continue
        out[PREFIX + name] = float(sum(values)) if name in SUMMED else float(statistics.fmean(values))
    out[PREFIX + "alarms_total"] = float(len(LEDGER.alarms))
    return out


def _any_rank(flag: bool, args: Any) -> bool:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return flag
    import torch

    device = getattr(args, "device", "cpu") if dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _run_of(callback: Any) -> Run | None:
    ref = getattr(callback, RUN, None)
    return ref() if ref is not None else None


def _raise_if_any_rank_alarmed(callback: Any, args: Any) -> None:
    run = _run_of(callback)
    if run is not None:
        with guarded(GUARD_ID, "deciding check L", fallback="these log-probs are not judged"):
            logprobs.flush(run)  # L judges the batches whose log-probs this step's (or evaluation's) loss computed
    local = LEDGER.take_unraised()
    if is_strict() and _any_rank(bool(local), args):
        raise error_for(local, elsewhere=not local)


@functools.lru_cache(maxsize=1)
def callback_class() -> type:
    """The guard's ``TrainerCallback`` (built once, when transformers is imported)."""
    from transformers import TrainerCallback

    class OffPolicyGuardCallback(TrainerCallback):
        """trl_compat's off-policy guard: its metrics in the logs, its alarms raised in strict mode."""

        def on_train_begin(self, args, state, control, **kwargs):
            if _guarded_args(args):
                run = _run_of(self)
                if run is not None:
                    # figures no training log took (this trainer's evaluate() after its last step)
                    # are not this training's: they made its first offpolicy/* values wrong
                    run.take_figures()
                # alarms no step end raised (fired outside any training step): logged, not this run's
                LEDGER.take_unraised()

        def on_step_end(self, args, state, control, **kwargs):
            if not _guarded_args(args) or not active():
                return
            run = _run_of(self)
            if run is not None and run.generations:
                LEDGER.steps_guarded += 1
            _raise_if_any_rank_alarmed(self, args)

        def on_evaluate(self, args, state, control, **kwargs):
            # evaluation generates too, and has no step end: every rank ends it here
            if _guarded_args(args) and active():
                _raise_if_any_rank_alarmed(self, args)

        def on_log(self, args, state, control, logs=None, **kwargs):
            run = _run_of(self)
            if logs is None or "loss" not in logs or not _guarded_args(args) or not active() or run is None or not run.generations:
                return
            values = metrics(run.take_figures())
            logs.update(values)
            if state.log_history and state.log_history[-1].get("loss") == logs.get("loss"):
                state.log_history[-1].update(values)

    return OffPolicyGuardCallback


def link(trainer: Any, run: Run) -> None:
    """Point ``trainer``'s instance of the callback at its run (no instance: nothing to link)."""
    handler = getattr(trainer, "callback_handler", None)
    for callback in getattr(handler, "callbacks", None) or ():
        if type(callback).__name__ == "OffPolicyGuardCallback" and type(callback).__module__ == __name__:
            setattr(callback, RUN, weakref.ref(run))


def add(module: Any) -> None:
    """Put the callback into ``transformers.trainer.DEFAULT_CALLBACKS`` (once)."""
    defaults = module.DEFAULT_CALLBACKS
    if callback_class() not in defaults:
        defaults.append(callback_class())


def remove() -> None:
    trainer = sys.modules.get("transformers.trainer")
    defaults = getattr(trainer, "DEFAULT_CALLBACKS", None)
    if defaults is not None and callback_class.cache_info().currsize and callback_class() in defaults:
        defaults.remove(callback_class())
