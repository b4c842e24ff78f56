"""none-reward-baseline: a completion that every reward function declines (returns ``None`` for) gets
reward 0, which enters its group's mean and std and gives it a non-zero advantage.

The bug: from 0.16.0 (``87fbb831d``) a reward function may return ``None`` for a completion it cannot
score (multi-task datasets: a math verifier on a code prompt); ``rewards_per_func`` holds NaN there and
the weighted sum uses ``nansum``. A row where *every* function returned ``None`` sums to **0**: that 0
lowers (or raises) the group's mean, changes its std (and the batch's, ``scale_rewards="batch"``) and the
unscorable completion itself gets the advantage of a 0 reward, so the policy is pushed away from (or
towards) text nothing judged. No error, no warning.

Upstream fix: PR #5902 (``1c7c7f988``, 1.6.0) marks such rows NaN after the sum, takes ``nanmean`` and
``nanstd`` for the group and batch baselines (and for ``normalize_then_sum``'s batch step), and sets
their advantage to 0 (``nan_to_num``).

Probe: ``GRPOTrainer._generate_and_score_completions`` gets ``rewards_per_func`` from
``self._calculate_rewards`` (0.19.0 on), sums it with ``.nansum(dim=1)`` and averages the groups with
``.mean(dim=1)``; which ``scale_rewards`` code it has decides how the fix reads the setting: a bool
(0.19 - 0.21), the 0.22.0 / 0.22.1 code whose labels are swapped (``scale-rewards-swapped``), or the
named modes (0.22.2 on): "needed". The fixed code (``unscorable_mask``, ``torch.nanmean`` of the
grouped rewards) gives "not needed"; any other form "undecided". TRL 0.16 - 0.18 score rewards inline
in ``_generate_and_score_completions`` / ``_prepare_inputs``, where this patch does not reach: their
window starts at 0.19.0, and the upstream ledger names them.

Fix: ``GRPOTrainer._calculate_rewards`` is wrapped to keep the ``rewards_per_func`` (all processes)
of the current batch; ``_generate_and_score_completions`` is wrapped: where some row is NaN for every
function, the advantages are computed again from those rewards as TRL 1.6.0 does (the same
``scale_rewards`` mode, as this release's code reads it, and ``multi_objective_aggregation`` where the
release has it) and this process's slice replaces the returned ``advantages``. A batch where every row
has a reward is returned as TRL made it, untouched. Not covered: the logged ``reward`` / ``reward_std``
metrics, which still count the declined rows as 0.

Run time: load-bearing: errors propagate. What the wrapper computes is the fix itself: falling back to
TRL's advantages on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 1.6.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "none-reward-baseline"
REWARDS = "_calculate_rewards"
METHOD = "_generate_and_score_completions"
KEPT = "_trl_compat_rewards_per_func"

_SCORES = "rewards_per_func = self._calculate_rewards("
_SUMS = ".nansum(dim=1)"
_GROUP_MEANS = (".view(-1, self.num_generations).mean(dim=1)", ".view(-1, num_generations).mean(dim=1)")
_FIXED = ("unscorable_mask", "torch.nanmean(rewards.view(")
# how the release's code reads scale_rewards -> {setting: the mode it computes}
SCALE_FORMS = {
    "if self.scale_rewards:": "bool",
    'if self.scale_rewards in ["batch", "none"]:': "swapped",
    'if self.scale_rewards in ["group", "none"]:': "named",
}
_SWAPPED = {"group": "none", "batch": "group", "none": "group"}  # 0.22.0 / 0.22.1: what each label does
EPSILON = 1e-4  # TRL's, in every release


def scale_form(source: str) -> str | None:
    return next((form for text, form in SCALE_FORMS.items() if text in source), None)


def probe(module):
    cls = module.GRPOTrainer
    method = getattr(cls, METHOD, None)
    if method is None or getattr(cls, REWARDS, None) is None:
        return undecided(f"GRPOTrainer has no {METHOD} / {REWARDS}: rewards are scored in code this patch does not know")
    source = code(method)
    if any(marker in source for marker in _FIXED):
        return not_needed("completions every reward function declined are left out of the baseline (fixed code)")
    if _SCORES not in source or _SUMS not in source or not any(mean in source for mean in _GROUP_MEANS):
        return undecided(f"GRPOTrainer.{METHOD} does not compute the rewards' baseline the way TRL 0.19 - 1.5 do")
    if scale_form(source) is None:
        return undecided(f"GRPOTrainer.{METHOD} reads scale_rewards in a way this patch does not know")
    return needed(
        "rewards_per_func.nansum(dim=1) gives a completion every reward function declined (None) reward 0, "
        "which enters the group's mean and std and gets an advantage; the advantages are computed again "
        "without those rows, as TRL 1.6.0 does"
    )


def nanstd(tensor, dim=None, keepdim=False):
    """TRL 1.6.0's ``nanstd``: Bessel-corrected, NaN where fewer than two values are not NaN."""
    import torch

    if dim is None:
        tensor, dim = tensor.reshape(-1), 0
    mean = torch.nanmean(tensor, dim=dim, keepdim=True)
    variance = torch.nanmean((tensor - mean) ** 2, dim=dim, keepdim=keepdim)
    count = torch.sum(~torch.isnan(tensor), dim=dim, keepdim=keepdim)
    correction = torch.where(count > 1, count / (count - 1), torch.full_like(variance, float("nan")))
    return torch.sqrt(variance * correction)


def baseline_free_advantages(rewards_per_func, weights, num_generations: int, scale: str, aggregation: str):
    """TRL 1.6.0's advantages (every process's rows): rows NaN for every function are left out of each
    baseline and get advantage 0. ``scale``: ``"group"``, ``"batch"`` or ``"none"``."""
    import torch

    unscorable = torch.isnan(rewards_per_func).all(dim=1)
    weights = weights.to(rewards_per_func.device).unsqueeze(0)
    if aggregation == "normalize_then_sum":
        grouped = rewards_per_func.view(-1, num_generations, rewards_per_func.shape[1])
        mean_k = torch.nanmean(grouped, dim=1, keepdim=True)
        std_k = nanstd(grouped, dim=1, keepdim=True) if num_generations > 1 else torch.zeros_like(mean_k)
        reward_k = ((grouped - mean_k) / (std_k + EPSILON)).view(-1, rewards_per_func.shape[1])
        rewards = (reward_k * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        advantages = (rewards - torch.nanmean(rewards)) / (std + EPSILON)
    else:
        rewards = (rewards_per_func * weights).nansum(dim=1)
        rewards[unscorable] = torch.nan
        grouped = rewards.view(-1, num_generations)
        mean = torch.nanmean(grouped, dim=1).repeat_interleave(num_generations, dim=0)
        if scale == "batch":
            std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 else torch.zeros_like(rewards)
        elif num_generations > 1:
            std = nanstd(grouped, dim=1).repeat_interleave(num_generations, dim=0)
        else:
            std = torch.zeros_like(rewards)
        advantages = rewards - mean
        if scale != "none":
            advantages = advantages / (std + EPSILON)
    return torch.nan_to_num(advantages, nan=0.0)


def scale_mode(trainer, form: str) -> str:
    """The scale this release's code applies for the trainer's ``scale_rewards`` setting."""
    value = trainer.scale_rewards
    if form == "bool":
        return "group" if value else "none"
    return _SWAPPED[value] if form == "swapped" else value


def _group_size(trainer) -> int:
    if not trainer.model.training and getattr(trainer, "num_generations_eval", None):
        return trainer.num_generations_eval  # 1.x evaluates with its own group size
    return trainer.num_generations


def corrected(trainer, output, rewards_per_func, form: str):
    """``output`` with this process's slice of the baseline-free advantages, where a row was declined by every function."""
    import torch

    if rewards_per_func is None or not torch.isnan(rewards_per_func).all(dim=1).any():
        return output
    local = output["advantages"]
    advantages = baseline_free_advantages(
        rewards_per_func,
        trainer.reward_weights,
        _group_size(trainer),
        scale_mode(trainer, form),
        getattr(trainer, "multi_objective_aggregation", "sum_then_normalize"),
    )
    start = trainer.accelerator.process_index * local.shape[0]
    output["advantages"] = advantages[start : start + local.shape[0]].to(device=local.device, dtype=local.dtype)
    return output


def _wrap_rewards(original):
    @functools.wraps(original)
    def _calculate_rewards(self, *args, **kwargs):
        rewards_per_func = original(self, *args, **kwargs)
        setattr(self, KEPT, rewards_per_func)
        return rewards_per_func

    return _calculate_rewards


def _wrap_generate_and_score(original, form: str):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        setattr(self, KEPT, None)  # a batch's rewards, never the previous batch's
        output = original(self, *args, **kwargs)
        rewards_per_func = getattr(self, KEPT, None)
        setattr(self, KEPT, None)
        if isinstance(output, dict) and "advantages" in output:
            output = corrected(self, output, rewards_per_func, form)
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    form = scale_form(code(getattr(module.GRPOTrainer, METHOD)))
    if form is None:  # the probe read one: the code changed under it
        raise RuntimeError(f"GRPOTrainer.{METHOD} no longer reads scale_rewards in a way this patch knows")
    patcher.wrap(module.GRPOTrainer, REWARDS, _wrap_rewards)
    patcher.wrap(module.GRPOTrainer, METHOD, lambda original: _wrap_generate_and_score(original, form))
