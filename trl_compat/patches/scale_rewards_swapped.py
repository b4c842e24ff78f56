"""scale-rewards-swapped: TRL 0.22.0/0.22.1 swapped the branches of ``scale_rewards``.

Upstream: fixed in 0.22.2 by PR #3992, commit a436c0a2d; on main by 35702ce37, 0.23.0.dev0.

The bug (issue #3991, fixed by PR #3992): PR #3935 (fe44806b6, 0.22.0.dev0, "PPO Lite") turned
``GRPOConfig.scale_rewards`` into ``"group" | "batch" | "none"`` (``True`` -> ``"group"``,
``False`` -> ``"none"``) with the labels of ``_generate_and_score_completions`` swapped:
``"batch"``/``"none"`` compute the group std and divide the advantages by it, ``"group"``
computes the batch std and never divides. So the default (``"group"``, ``True``) trains with
advantages that are not scaled at all (``r - group mean``), ``"none"``/``False`` (Dr. GRPO) gets
group-std scaling, and ``"batch"`` gets group-std scaling too. No error; ``reward_std`` logs the
std of the branch taken.

Where it shows: TRL 0.22.0 - 0.22.1 and main-branch builds between fe44806b6 and 35702ce37.

Probe: ``_generate_and_score_completions`` reads ``if self.scale_rewards in ["batch", "none"]:``
and ``elif self.scale_rewards == "group":`` (the swapped labels), and ``GRPOTrainer.__init__`` sets
``self.scale_rewards`` (the attribute relabelled below). The fixed code (``in ["group", "none"]``)
or the boolean ``scale_rewards`` of TRL <= 0.21 give "not needed"; swapped labels that
``__init__`` does not set, or any other mixture, give "undecided".

Fix: after ``GRPOTrainer.__init__`` the attribute TRL's branches read is relabelled so that each
value does what its name says: intended ``"group"`` -> ``"batch"`` (the buggy branch that divides
by the group std), intended ``"none"`` -> ``"group"`` (the buggy branch that does not divide).
Advantages are then those of TRL 0.22.2 bit for bit, and the logged ``reward_std`` is the group
std for ``"group"``. Two logging-only differences remain for ``"none"``: ``reward_std`` and
``frac_reward_zero_std`` are computed from the batch std (0.22.2 logs the group std there).
``trainer.scale_rewards`` shows the internal label afterwards.

Intended ``"batch"`` cannot be expressed by relabelling: no branch of the buggy code divides by
the batch std. It is left as TRL runs it (advantages scaled by the *group* std, as with
``"group"``) and every ``GRPOTrainer`` built with it logs a warning recommending TRL 0.22.2 (a
drop-in patch release). The patch's status is per process, so it stays "applied"; the warning is
how a run with ``"batch"`` learns that its value was not corrected. Correcting it would mean
rescaling the advantages after TRL computed them, from the batch std that only TRL's metrics
hold; a drop-in upgrade is the better answer for the one value introduced in the same release.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.22.0 and 0.22.1 are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import logging

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "scale-rewards-swapped"
GENERATE = "_generate_and_score_completions"

_SWAPPED = ('if self.scale_rewards in ["batch", "none"]:', 'elif self.scale_rewards == "group":')
_FIXED = 'if self.scale_rewards in ["group", "none"]:'
_SETS_ATTRIBUTE = "self.scale_rewards ="

# What the user asked -> the label whose branch in the buggy code does it.
RELABEL = {"group": "batch", "none": "group"}


def probe(module):
    cls = module.GRPOTrainer
    method = getattr(cls, GENERATE, None)
    if method is None:
        return not_needed(f"GRPOTrainer has no {GENERATE}: not the code of TRL 0.22")
    generate = code(method)
    if _FIXED in generate:
        return not_needed('"group" and "none" compute the group std and only "none" skips the division (fixed code)')
    swapped = [needle in generate for needle in _SWAPPED]
    if not any(swapped):
        if "self.scale_rewards in [" not in generate and "self.scale_rewards ==" not in generate:
            return not_needed("scale_rewards has no group/batch/none labels here (boolean scale_rewards)")
        return undecided(f"GRPOTrainer.{GENERATE} reads scale_rewards labels in an unknown way")
    if not all(swapped):
        return undecided(f"GRPOTrainer.{GENERATE} has only part of the swapped scale_rewards branches")
    if _SETS_ATTRIBUTE not in code(cls.__init__):
        return undecided("GRPOTrainer.__init__ does not set self.scale_rewards: nothing to relabel")
    return needed(
        'scale_rewards labels are swapped: "group" (the default) leaves advantages unscaled, "none" divides '
        "them by the group std; the label TRL reads is relabelled so each value does what its name says "
        '("batch" cannot be corrected: use TRL 0.22.2)'
    )


def _after(trainer, arguments) -> None:
    intended = getattr(trainer, "scale_rewards", None)
    if isinstance(intended, str) and intended in RELABEL:
        trainer.scale_rewards = RELABEL[intended]
        log.info(
            "trl_compat: %s: scale_rewards=%r runs TRL 0.22.1's %r branch, which does what %r means",
            PATCH_ID,
            intended,
            RELABEL[intended],
            intended,
        )
    elif intended == "batch":
        log.warning(
            "trl_compat: %s: scale_rewards='batch' cannot be corrected on this TRL: its advantages are "
            "divided by the per-group std (as with 'group'), not the batch std. Upgrade to trl==0.22.2, "
            "a drop-in patch release with the fix (PR #3992)",
            PATCH_ID,
        )


apply = around_init(after=_after)
