"""eval-one-generation-nan: on TRL 0.26.x, evaluating with ``num_generations_eval=1`` gives NaN
advantages, a NaN ``eval_loss`` and a NaN ``eval_reward_std``.

The bug
    TRL 0.26.0 added ``GRPOConfig.num_generations_eval``: evaluation groups its completions by
    that many per prompt. ``_generate_and_score_completions`` takes the group's standard deviation
    with ``rewards.view(-1, num_generations).std(dim=1)`` (``scale_rewards="batch"``:
    ``rewards.std()``), which is NaN for a group of one (Bessel's correction divides by zero). The
    advantages are then ``0 / (NaN + 1e-4)``: NaN for every completion, so the eval loss is NaN
    (``metric_for_best_model="eval_loss"`` and early stopping then see NaN), ``eval_reward_std``
    is NaN and ``eval_frac_reward_zero_std`` 0 where every group has zero spread, and the logged
    completions table carries NaN advantages. Training is untouched: it requires
    ``num_generations >= 2``.
    Upstream: TRL PR #4662 (``37ad7c2e7``, first in 0.27.0) takes zeros as the std of a group of
    one (and of a batch of one, ``scale_rewards="batch"``).

How the probe recognises it
    ``GRPOTrainer._generate_and_score_completions`` (comments dropped) groups by
    ``self.num_generations_eval`` in eval and takes ``rewards.view(-1, num_generations).std(dim=1)``
    with no ``num_generations > 1`` guard: needed. The guard: not needed. No
    ``num_generations_eval`` (TRL < 0.26): not needed. Anything else: undecided.

The fix
    ``_generate_and_score_completions`` is wrapped. In evaluation (the model not in training mode)
    with ``num_generations_eval == 1``, what TRL returned and logged is set to what 0.27.0
    computes: a group of one has advantage 0 whatever the scaling (its reward minus its own mean),
    so NaN advantages become 0; where this batch's logged ``reward_std`` is NaN it becomes 0 and
    ``frac_reward_zero_std`` 1 (every std zero), and the NaN advantages of this batch in the
    completions table become 0. Training batches, and evaluation with groups of two or more, are
    returned untouched.

Run time: load-bearing: errors propagate. What the wrapper does is the fix; an error falling back to
TRL's own output would be the NaN again (``trl_compat._engine.guarded``).

Delete when: TRL < 0.27.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools
import math

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "eval-one-generation-nan"
METHOD = "_generate_and_score_completions"

_EVAL_GROUPS = "self.num_generations_eval"
_GROUP_STD = "rewards.view(-1, num_generations).std(dim=1)"
_GUARD = "if num_generations > 1:"


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return not_needed(f"GRPOTrainer has no {METHOD}: no num_generations_eval (TRL < 0.26)")
    source = code(method)
    if _EVAL_GROUPS not in source:
        return not_needed("evaluation groups completions by num_generations (TRL < 0.26): groups of two or more")
    if _GUARD in source:
        return not_needed("a group of one gets std 0 (fixed code)")
    if _GROUP_STD in source:
        return needed(
            "with num_generations_eval=1 the std of each one-completion group is NaN: NaN advantages, eval_loss and eval_reward_std"
        )
    return undecided(f"GRPOTrainer.{METHOD} computes the group std in a way this patch does not know")


def _is_nan(value) -> bool:
    return isinstance(value, float) and math.isnan(value)


def _fix_logs(trainer, count: int) -> None:
    metrics = getattr(trainer, "_metrics", {}).get("eval")
    if metrics is not None and metrics.get("reward_std") and _is_nan(metrics["reward_std"][-1]):
        metrics["reward_std"][-1] = 0.0
        if metrics.get("frac_reward_zero_std"):
            metrics["frac_reward_zero_std"][-1] = 1.0
    advantages = getattr(trainer, "_logs", {}).get("advantages")
    if advantages:
        for i in range(max(len(advantages) - count, 0), len(advantages)):
            if _is_nan(advantages[i]):
                advantages[i] = 0.0


def corrected(trainer, output):
    """``output`` with this batch of one-completion groups as TRL 0.27.0 gives it; its logs too."""
    import torch

    advantages = output["advantages"]
    output["advantages"] = torch.nan_to_num(advantages, nan=0.0)
    # the completions table logs every process's advantages
    _fix_logs(trainer, advantages.shape[0] * getattr(trainer.accelerator, "num_processes", 1))
    return output


def _wrap(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        one_per_group = getattr(self, "num_generations_eval", None) == 1
        if one_per_group and not self.model.training and isinstance(output, dict) and "advantages" in output:
            output = corrected(self, output)
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap)
