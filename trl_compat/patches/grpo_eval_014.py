"""grpo-eval-0.14: GRPO evaluation on TRL 0.14.0 (loss and reward metrics, kept apart from training's).

Main-branch builds: 0.15.0.dev0 installs older than PR #2694 have the bug too.

The bug
    TRL 0.14.0's GRPOTrainer generates inside ``compute_loss`` from the raw
    batch, a list of prompt dicts: its data collator returns the features and
    its ``_prepare_inputs`` returns them unchanged. It has no
    ``prediction_step``, so with an ``eval_dataset`` (``eval_strategy`` or
    ``trainer.evaluate()``) transformers' ``Trainer.prediction_step`` runs and
    reads ``inputs.get("return_loss")`` on that list: ``AttributeError: 'list'
    object has no attribute 'get'``. TRL PR #2694 (fecaa991d, 0.15.0) added a
    ``prediction_step`` that computes the GRPO loss under ``torch.no_grad()``
    and returns ``(loss, None, None)``, and made ``log`` prefix the GRPO
    metrics with ``eval_`` during evaluation; TRL 0.16 keeps training and
    evaluation metrics in separate stores so neither leaks into the other.

Where it shows: trl 0.14.0 (and main-branch installs before PR #2694, which report
0.15.0.dev0).

How the probe recognises it
    From the code: no class between GRPOTrainer and transformers' Trainer
    defines ``prediction_step``; transformers' ``prediction_step`` calls
    ``inputs.get(``; GRPOTrainer's own ``_prepare_inputs`` only returns its
    argument and its ``compute_loss`` reads the prompts from the raw list
    (``x["prompt"] for x in inputs``). ``log`` and ``compute_loss`` must keep
    their metrics in ``self._metrics`` (what the fix separates); otherwise the
    probe is undecided.

The fix
    TRL 0.15's ``prediction_step``, unchanged: ``_prepare_inputs``, then
    ``compute_loss`` under ``no_grad`` and ``compute_loss_context_manager``, the
    loss returned as ``(loss, None, None)``. While it runs, ``self._metrics``
    points at an evaluation store, and ``log`` is wrapped so that a call with
    ``eval_`` keys (what ``Trainer.evaluate`` logs) adds that store's averages
    as ``eval_reward``, ``eval_kl``, ``eval_reward_std``,
    ``eval_completion_length``, ``eval_rewards/<func>`` (the names 0.15 uses)
    and leaves the training metrics for the next training log, as TRL 0.16
    does. Under DeepSpeed ZeRO-3 evaluation hands GRPO the bare module, which
    0.14.0's ``unwrap_model_for_generation`` cannot take: that is the
    zero3-unwrap patch, and both are needed there.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.14.x (and 0.15.0.dev0 installs older than PR #2694)
(the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import ast
import functools
import logging
from collections import defaultdict

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, defining_class, syntax

log = logging.getLogger(__name__)

PATCH_ID = "grpo-eval-0.14"
EVAL_STORE = "_trl_compat_eval_metrics"  # on the trainer instance
RAW_PROMPTS = 'x["prompt"] for x in inputs'


def _only_returns_its_argument(function) -> bool:
    fn = syntax(function).body[0]
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return False
    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    params = [a.arg for a in fn.args.args]
    return (
        len(body) == 1
        and isinstance(body[0], ast.Return)
        and isinstance(body[0].value, ast.Name)
        and len(params) >= 2
        and body[0].value.id == params[1]
    )


def probe(module):
    from transformers import Trainer as base  # already imported by TRL

    cls = module.GRPOTrainer
    if not issubclass(cls, base):
        return undecided("GRPOTrainer is not a transformers Trainer")
    owner = defining_class(cls, "prediction_step")
    if owner is not None and owner is not base and issubclass(owner, base):
        return not_needed(f"{owner.__qualname__} defines its own prediction_step (TRL >= 0.15.0 behaviour)")
    step = code(base.prediction_step)
    prepare = vars(cls).get("_prepare_inputs")
    passes_through = prepare is not None and _only_returns_its_argument(prepare)
    loss = code(cls.compute_loss)
    log_source = code(vars(cls)["log"]) if "log" in vars(cls) else ""
    if "inputs.get(" not in step:
        return undecided(
            "transformers' Trainer.prediction_step no longer calls inputs.get(...): cannot tell whether it takes GRPO's raw batch"
        )
    if not (passes_through and RAW_PROMPTS in loss):
        return undecided("GRPOTrainer has no prediction_step but does not pass the raw batch to compute_loss the way TRL 0.14.0 does")
    if "self._metrics" not in log_source or "self._metrics[" not in loss:
        return undecided("GRPOTrainer.log/compute_loss do not keep their metrics in self._metrics")
    return needed(
        "GRPOTrainer has no prediction_step and passes its raw batch (a list of prompt dicts) through "
        "_prepare_inputs: transformers' Trainer.prediction_step calls inputs.get(...) on it -> AttributeError: "
        "'list' object has no attribute 'get'"
    )


def _eval_store(trainer):
    store = trainer.__dict__.get(EVAL_STORE)
    if store is None:
        store = trainer.__dict__[EVAL_STORE] = defaultdict(list)
    return store


def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
    """TRL 0.15's GRPOTrainer.prediction_step (PR #2694), with evaluation metrics kept apart."""
    import torch

    inputs = self._prepare_inputs(inputs)
    training_metrics = self._metrics
    self._metrics = _eval_store(self)
    try:
        with torch.no_grad():
            with self.compute_loss_context_manager():
                loss = self.compute_loss(model, inputs)
            loss = loss.mean().detach()
    finally:
        self._metrics = training_metrics
    return loss, None, None


def _is_eval(logs) -> bool:
    return isinstance(logs, dict) and any(isinstance(k, str) and k.startswith("eval_") for k in logs)


def _wrap_log(original):
    @functools.wraps(original)  # not named `log`: that is the module's logger
    def log_with_eval_metrics(self, logs, *args, **kwargs):
        if not _is_eval(logs):
            return original(self, logs, *args, **kwargs)
        store = self.__dict__.get(EVAL_STORE)
        try:
            metrics = {f"eval_{k}": sum(v) / len(v) for k, v in (store or {}).items() if v}
        except Exception:  # odd values: log what Trainer gave, as TRL would
            log.debug("trl_compat: %s: could not average the evaluation metrics", PATCH_ID, exc_info=True)
            metrics = {}
        if store is not None:
            store.clear()
        logs = {**logs, **{k: v for k, v in metrics.items() if k not in logs}}
        # TRL's log adds and clears self._metrics: hand it an empty store so the
        # training metrics wait for the next training log instead of leaking in here.
        training_metrics = self._metrics
        self._metrics = defaultdict(list)
        try:
            return original(self, logs, *args, **kwargs)
        finally:
            self._metrics = training_metrics

    return log_with_eval_metrics


def apply(module, patcher) -> None:
    cls = module.GRPOTrainer
    patcher.replace(cls, "prediction_step", prediction_step)
    patcher.wrap(cls, "log", _wrap_log)
