"""dapo-generation-batch-normalizer: the DAPO/CISPO/VESPO loss is scaled by ``GA / steps_per_generation``.

The bug (issue #5619, fixed by PR #6024; the Liger loss's half by PR #5890): PR #3938 (2324245ca,
0.22.0.dev0) made ``loss_type="dapo"`` (the default from 0.22.0) divide each micro-batch's summed
token loss by ``inputs["num_items_in_batch"] / num_processes``. ``_generate_and_score_completions``
counts ``num_items_in_batch`` over the whole *generation* batch (``steps_per_generation``
micro-batches), while one optimizer step accumulates ``gradient_accumulation_steps`` micro-batches.
Where the two differ (``steps_per_generation`` or ``generation_batch_size`` set), every optimizer
step's loss and gradient are multiplied by ``GA / steps_per_generation`` (e.g. halved with
``steps_per_generation=4``, ``GA=2``): silently a different learning rate. ``"cispo"`` (0.26.0)
and ``"vespo"`` (1.0.0) share the branch; 1.8.0's entropy term (``entropy_coef``) divides by the
same normaliser.

Upstream: the branch reads ``elif self.loss_type == "dapo":`` (0.22 - 0.25), ``in ["cispo",
"dapo"]`` (0.26 - 0.29), ``in ["cispo", "dapo", "vespo"]`` (1.x), always with ``normalizer =
inputs["num_items_in_batch"] / self.accelerator.num_processes`` (1.9.0: ``...].clamp(min=1.0) /
...``). PR #6024 (in the 1.9.1 release, not in the v1.9.0 tag) adds ``if mode == "train":
normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation``.

Probe: ``GRPOTrainer._compute_loss`` divides by ``inputs["num_items_in_batch"]`` without
``self.args.steps_per_generation`` in the method: "needed". The 1.9.1 rescale gives "not needed".
No ``_compute_loss``, or a ``_compute_loss`` that reads ``num_items_in_batch`` in another form,
gives "undecided".

Fix (as PR #6024): ``GRPOTrainer._compute_loss`` is wrapped; in train mode (``self.model.training``,
TRL's own test) and for a loss type of that branch it runs on a shallow copy of ``inputs`` whose
``num_items_in_batch`` is multiplied by ``current_gradient_accumulation_steps /
steps_per_generation``, so the accumulated loss of one optimizer step is the token mean of its
window, as in 1.9.1. Eval calls, the other loss types and the Liger loss (``compute_liger_loss``,
GPU only) run TRL's code untouched; the caller's ``inputs`` is never changed.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 1.9.1 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "dapo-generation-batch-normalizer"
METHOD = "_compute_loss"
# the loss types of the branch that divides by num_items_in_batch (cispo from 0.26.0, vespo from 1.0.0)
TOKEN_COUNT_LOSSES = frozenset({"dapo", "cispo", "vespo"})

_DIVIDES = 'normalizer = inputs["num_items_in_batch"]'
_RESCALED = "self.args.steps_per_generation"


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}: unknown loss code")
    source = code(method)
    if _RESCALED in source:
        return not_needed("the token-count normaliser is rescaled to one accumulation window (fixed code)")
    if _DIVIDES not in source:
        if "num_items_in_batch" in source:
            return undecided(f"GRPOTrainer.{METHOD} reads num_items_in_batch in an unknown way")
        return undecided(f"GRPOTrainer.{METHOD} has no loss normalised by num_items_in_batch: unknown loss code")
    return needed(
        "the dapo/cispo/vespo loss divides by the token count of the whole generation batch: with "
        "steps_per_generation != gradient_accumulation_steps every step's loss is scaled by GA / steps_per_generation; "
        "the normaliser is rescaled to one accumulation window, as TRL 1.9.1 does"
    )


def rescaled_inputs(trainer, inputs):
    """What this patch's wrapper hands to TRL's ``_compute_loss`` for ``inputs`` (``inputs`` itself where it
    changes nothing). entropy-coef-normalizer, stacked above, reads TRL's normaliser through it."""
    model = getattr(trainer, "model", None)
    if model is None or not model.training or getattr(trainer, "loss_type", None) not in TOKEN_COUNT_LOSSES:
        return inputs
    if not isinstance(inputs, dict) or "num_items_in_batch" not in inputs:
        return inputs
    # TRL's own choice: the steps of the current window (the last window of an epoch may be shorter)
    accumulation = getattr(trainer, "current_gradient_accumulation_steps", None) or trainer.args.gradient_accumulation_steps
    per_generation = trainer.args.steps_per_generation
    rescaled = dict(inputs)
    rescaled["num_items_in_batch"] = inputs["num_items_in_batch"] * accumulation / per_generation
    return rescaled


def _wrap_compute_loss(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _compute_loss(self, *args, **kwargs):
        model = getattr(self, "model", None)
        if model is None or not model.training or getattr(self, "loss_type", None) not in TOKEN_COUNT_LOSSES:
            return original(self, *args, **kwargs)
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:  # not a call this wrapper understands: TRL's code answers it
            return original(self, *args, **kwargs)
        inputs = bound.arguments.get("inputs")
        rescaled = rescaled_inputs(self, inputs)
        if rescaled is inputs:
            return original(self, *args, **kwargs)
        bound.arguments["inputs"] = rescaled
        return original(*bound.args, **bound.kwargs)

    return _compute_loss


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap_compute_loss)
