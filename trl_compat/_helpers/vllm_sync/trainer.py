"""The trainer side, what both vLLM-sync patches call and install: push ``trainer.model`` into
``trainer.llm``, falling back to the in-place merge or to TRL's own code."""

from __future__ import annotations

import functools
import logging
from typing import Any, Callable

from trl_compat._engine import warn_once
from trl_compat._helpers.models import peel
from trl_compat._helpers.vllm_sync.stream import Plan, push, push_inplace
from trl_compat._helpers.vllm_sync.structure import Peft, UnsupportedModel

log = logging.getLogger(__name__)


def vllm_model_of(trainer: Any) -> Any:
    """The colocated vLLM model TRL 0.14/0.15 load weights into (main process only)."""
    return trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model


def sync_trainer(trainer: Any) -> bool:
    """Push ``trainer.model`` into ``trainer.llm``. Runs on every rank.

    Returns False, having done nothing, when TRL's own code should run instead (a trainer
    or model this module does not recognise)."""
    try:
        model = trainer.model
        is_main = bool(trainer.accelerator.is_main_process)
        llm_model = vllm_model_of(trainer) if is_main else None
    except AttributeError as exc:
        warn_once(log, "trainer", "trl_compat: vLLM sync: unexpected trainer (%s); using TRL's own weight sync", exc)
        return False
    try:
        plan = Plan(model)
    except UnsupportedModel as exc:
        peft = Peft()
        peft_model = peel(model, peft=False, fsdp=False)
        if peft.isinstance(peft_model, "PeftModel") and callable(getattr(peft_model, "merge_adapter", None)):
            warn_once(
                log,
                "inplace:" + str(exc),
                "trl_compat: vLLM sync: %s is not supported by the out-of-place merge; falling back to "
                "TRL 0.15.1's in-place merge_adapter()/unmerge_adapter() (vLLM gets the merged weights, "
                "but the training weights may change by rounding at each sync)",
                exc,
            )
            push_inplace(peft_model, llm_model, is_main)
            return True
        warn_once(log, "unsupported:" + str(exc), "trl_compat: vLLM sync: %s; using TRL's own weight sync", exc)
        return False
    push(plan, llm_model, is_main)
    return True


# -- wrappers the patches install ----------------------------------------------------------


def make_move_model_to_vllm(original: Callable) -> Callable:
    """Replacement for ``GRPOTrainer._move_model_to_vllm(self)``."""

    @functools.wraps(original)
    def _move_model_to_vllm(self, *args, **kwargs):
        if args or kwargs or not sync_trainer(self):
            return original(self, *args, **kwargs)
        return None

    return _move_model_to_vllm


def make_presync(original: Callable) -> Callable:
    """Wrap the method that holds TRL's inline sync (0.14.0: ``compute_loss``; early
    0.15.0.dev0: ``_prepare_inputs``). It loads only when ``self.state.global_step !=
    self._last_loaded_step``; we sync first and set ``_last_loaded_step``, so TRL's inline
    code (PEFT names, no merge, a whole-model gather) is skipped for that step."""

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        try:
            due = bool(self.args.use_vllm) and self.state.global_step != self._last_loaded_step
        except AttributeError:
            due = False
        if due and sync_trainer(self):
            self._last_loaded_step = self.state.global_step
        return original(self, *args, **kwargs)

    return wrapper
