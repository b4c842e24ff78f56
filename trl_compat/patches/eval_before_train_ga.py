"""eval-before-train-ga: evaluating a GRPOTrainer before ``train()`` raises AttributeError.

Upstream: fixed in 0.27.1 by PR #4852, commit 7e1a81116; on main by 7c4b6f169, 0.28.0.dev0.

The bug (issues #4010, #4669, #4850; PR #3938, 2324245ca, 0.22.0.dev0, introduced it): the
``"grpo"``, ``"bnpo"`` and ``"dr_grpo"`` losses (and the Liger loss) are divided by
``self.current_gradient_accumulation_steps``, an attribute transformers' ``Trainer`` sets only
inside its training loop. ``eval_on_start=True`` or ``trainer.evaluate()`` before ``train()``
raises ``AttributeError: 'GRPOTrainer' object has no attribute
'current_gradient_accumulation_steps'``. After training has started, the eval loss is silently
divided by the gradient-accumulation steps of the last training step (logging only). The default
``loss_type="dapo"`` normalises by ``num_items_in_batch`` instead and is not affected.

Where it shows: TRL 0.22.0 - 0.27.0 and main-branch builds between 2324245ca and 7c4b6f169.

Probe: ``GRPOTrainer._compute_loss`` or ``compute_liger_loss`` divides by
``self.current_gradient_accumulation_steps`` without the fixed code's
``... if mode == "train" else 1.0``. Source that cannot be read gives "undecided".

Fix (as PR #4852): ``GRPOTrainer.compute_loss`` is wrapped; in eval mode (``self.model`` not
training, TRL's own test) it runs with ``current_gradient_accumulation_steps = 1`` set on the
trainer for the call and restores what was there (or nothing) afterwards; training calls run
TRL's code untouched. So the eval loss is the same before and after training and equals TRL
0.27.1's. A class-level default of 1 (the lighter fix) would cure the crash but leave eval losses
after the first training step divided by the accumulation steps: with ``eval_on_start=True`` the
eval curve would jump by that factor after step 0.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.27.1 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "eval-before-train-ga"
ATTRIBUTE = "current_gradient_accumulation_steps"
LOSS_METHODS = ("_compute_loss", "compute_liger_loss")

_DIVIDES = f"/ self.{ATTRIBUTE}"
_GUARDED = f'self.{ATTRIBUTE} if mode == "train" else'
_MISSING = object()


def probe(module):
    cls = module.GRPOTrainer
    unguarded = []
    for name in LOSS_METHODS:
        method = getattr(cls, name, None)
        if method is None:
            continue
        source = code(method)
        if _DIVIDES in source and _GUARDED not in source:
            unguarded.append(name)
    if not unguarded:
        if not any(getattr(cls, name, None) is not None for name in LOSS_METHODS):
            return undecided("GRPOTrainer has neither _compute_loss nor compute_liger_loss: unknown loss code")
        return not_needed(f"the GRPO loss does not divide by {ATTRIBUTE} in eval mode")
    return needed(
        f"GRPOTrainer.{'/'.join(unguarded)} divides the loss by self.{ATTRIBUTE}, which only train() sets: "
        f"evaluating before train() raises AttributeError; eval runs with {ATTRIBUTE} = 1, as TRL 0.27.1 does"
    )


def _wrap_compute_loss(original):
    @functools.wraps(original)
    def compute_loss(self, *args, **kwargs):
        model = getattr(self, "model", None)
        if model is None or model.training:
            return original(self, *args, **kwargs)
        # instance __dict__, not setattr: restore exactly what was there, inherited default or nothing
        saved = vars(self).get(ATTRIBUTE, _MISSING)
        vars(self)[ATTRIBUTE] = 1
        try:
            return original(self, *args, **kwargs)
        finally:
            if saved is _MISSING:
                vars(self).pop(ATTRIBUTE, None)
            else:
                vars(self)[ATTRIBUTE] = saved

    return compute_loss


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, "compute_loss", _wrap_compute_loss)
