"""metric-for-best-model: ``metric_for_best_model`` naming a GRPO metric (``"reward"``) is not found.

The bug: ``GRPOTrainer.log`` adds its own averages (``reward``, ``reward_std``, ``rewards/<name>/mean``,
``completions/mean_length``, ..., with the ``eval_`` prefix during evaluation) to a *new* dict,
``logs = {**logs, **metrics}``, and logs that one. ``Trainer.evaluate`` logs ``output.metrics`` and
returns that same dict, and the training loop picks the best checkpoint from what ``evaluate``
returned: it holds ``eval_loss`` and the timings only. So ``metric_for_best_model="reward"`` (or
``"eval_reward"``) stops training at the first evaluation with ``KeyError: "The
`metric_for_best_model` training argument is set to 'eval_reward', which is not found in the
evaluation metrics. ..."``, and ``trainer.evaluate()`` returns none of GRPO's metrics, though the log
shows them.
From 0.15.0 (``prediction_step`` and the ``eval_`` prefix, PR #2694;
0.14.0 has no evaluation of its own: ``grpo-eval-0.14``).

Upstream fix: PR #5811 (``4711a21d6``, 1.5.0): ``logs.update(metrics)``, so the caller's dict gets
them.

Probe: ``GRPOTrainer.log`` holds ``logs = {**logs, **metrics}`` and prefixes ``eval_``: "needed";
``logs.update(metrics)``, or the new dict without the ``eval_`` prefix (0.14.0's code): "not needed";
any other form: "undecided".

Fix: ``GRPOTrainer.log`` is wrapped: after TRL's, the caller's ``logs`` dict gets the keys of the
entry that ``Trainer.log`` appended to ``state.log_history`` for this call (the dict TRL logged, with
``epoch``), all but the ``step`` that ``Trainer.log`` adds to that entry only: what the caller's dict
holds after TRL 1.5.0's ``log``. Where the call appended no entry, the dict is left as TRL left it.

Run time: load-bearing: errors propagate. What the wrapper does is the fix itself: falling back to
TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.5.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

BUGGY = "logs = {**logs, **metrics}"
FIXED = "logs.update(metrics)"
EVAL_PREFIX = 'metrics = {f"eval_{key}": val for key, val in metrics.items()}'


def probe(module):
    source = code(module.GRPOTrainer.log)
    if FIXED in source:
        return not_needed("GRPOTrainer.log adds its metrics to the caller's dict (logs.update(metrics))")
    if BUGGY in source and EVAL_PREFIX not in source:
        # 0.14.0's form (and 0.15.0.dev0 builds before PR #2694): its evaluation crashes, grpo-eval-0.14's domain
        return not_needed("GRPOTrainer.log has no eval_ metrics: this release does not evaluate GRPO on its own")
    if BUGGY in source:
        return needed(
            f"GRPOTrainer.log logs {BUGGY}: evaluate() returns none of GRPO's eval metrics, so "
            "metric_for_best_model='reward' raises KeyError; the caller's dict gets what was logged"
        )
    return undecided("GRPOTrainer.log merges its metrics in a way this patch does not know")


def _wrap_log(original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def log(self, *args, **kwargs):
        logs = signature.bind(self, *args, **kwargs).arguments.get("logs") if signature is not None else None
        history = getattr(getattr(self, "state", None), "log_history", None)
        before = len(history) if isinstance(history, list) else None
        result = original(self, *args, **kwargs)
        if isinstance(logs, dict) and before is not None and len(history) == before + 1:
            # Trainer.log appends {**logged, "step": global_step}: the dict TRL logged, which TRL 1.5.0
            # logs in place; "step" is the history's own key, not the caller's
            logged = history[-1]
            logs.update({key: value for key, value in logged.items() if key != "step" or key in logs})
        return result

    return log


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, "log", _wrap_log)
