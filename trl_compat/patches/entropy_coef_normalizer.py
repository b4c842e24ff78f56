"""entropy-coef-normalizer: the entropy bonus of the dapo/cispo/vespo loss is a token mean, as TRL 1.10.0.

The bug (TRL 1.8.0 - 1.9.x; ledger record ``1.9.2..1.10.0:trl/trainer/grpo_trainer.py#2``, fixed in 1.10.0):
PR #6140 (34c7f0d85, 1.8.0) added ``entropy_coef`` (and the adaptive controller): ``loss = loss -
apply_coef * entropy_loss``. For ``loss_type`` in cispo/dapo/vespo, ``GRPOTrainer._compute_loss``
divides the summed entropies by the loss's token-count normaliser (``num_items_in_batch /
num_processes``; clamped from 1.9.0, rescaled by ``GA / steps_per_generation`` in train mode from
1.9.1), the other loss types take the mean over ``effective_mask`` divided by the accumulation steps. TRL
1.10.0 uses the latter for every loss type: ``entropy_loss = (entropies * effective_mask).sum() /
effective_mask.sum().clamp(min=1.0) / accumulation_factor``. Before it, the same ``entropy_coef``
meant another bonus for these loss types (with ``top_entropy_quantile < 1`` the masked-out tokens
still counted in the denominator; with ``steps_per_generation != GA`` on 1.8 - 1.9.0 the count was
the whole generation batch's; from 1.9.1 a micro-batch's bonus is weighted by its share of the
window's tokens): silently a different objective. The fix's pull request is not in the readable
history: the record is the wheels' diff.

Probe (``GRPOTrainer._compute_loss``, read through ``code()``): no ``_entropy_bonus_enabled`` (before
1.8.0) or 1.10.0's ``accumulation_factor`` line: "not needed". "needed" where the cispo/dapo/vespo
branch of the entropy term divides by ``normalizer`` (once) and the method has every line the fix
relies on: the loss mask (``completion_mask`` times ``tool_mask``), the entropies from
``_get_per_token_logps_and_entropies`` and the entropy mask from ``get_high_entropy_mask``, the mode
from ``self.model.training``, ``effective_mask``, the static and adaptive ``apply_coef`` and ``loss =
loss - apply_coef * entropy_loss``, and a normaliser of a known form (plain 1.8.0, clamped 1.9.0,
clamped and rescaled in train mode 1.9.1): else "undecided".

Fix: ``GRPOTrainer._compute_loss`` is wrapped. For a dapo/cispo/vespo call with the bonus enabled it
reads ``apply_coef`` before the call as TRL does (the adaptive update comes after it), wraps the
trainer's ``_get_per_token_logps_and_entropies`` and ``get_high_entropy_mask`` on the instance for the
duration of the call to see the entropies and the entropy mask TRL uses, and returns TRL's loss plus
``apply_coef * (S / normalizer - S / effective_mask.sum().clamp(min=1) / accumulation)``, ``S`` the
masked entropy sum: TRL's buggy term taken back (its gradient too) and 1.10.0's term put in. The
normaliser is computed as the release's own line does, from the inputs TRL's method receives: where
``dapo-generation-batch-normalizer`` (registered before, so stacked below) wraps the method, through
that patch's ``rescaled_inputs``. Metrics and the adaptive controller are TRL's own (1.10.0 did not
change them). The Liger loss refuses ``entropy_coef`` (TRL raises at init).

Run time: load-bearing: errors propagate. The correction is the fix itself: falling back to TRL's
loss on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 1.10.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._engine.patcher import markers
from trl_compat._helpers.source import code
from trl_compat.patches import dapo_generation_batch_normalizer as dapo

PATCH_ID = "entropy-coef-normalizer"
METHOD = "_compute_loss"
TOKEN_COUNT_LOSSES = frozenset({"cispo", "dapo", "vespo"})
CAPTURED = ("_get_per_token_logps_and_entropies", "get_high_entropy_mask")

# the branch of the bug: for these loss types the summed entropies are divided by the policy loss's normaliser
_BUGGY = 'if self.loss_type in ["cispo", "dapo", "vespo"]: entropy_loss = (entropies * effective_mask).sum() / normalizer else:'
_FIXED = "/ effective_mask.sum().clamp(min=1.0) / accumulation_factor"
_PLAIN = 'normalizer = inputs["num_items_in_batch"] / self.accelerator.num_processes'
_CLAMPED = 'normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes'
_RESCALED = 'if mode == "train": normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation'
_RELIED_ON = (
    'mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]',
    "per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(",
    "if self.top_entropy_quantile < 1.0: entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)",
    "else: entropy_mask = None",
    'mode = "train" if self.model.training else "eval"',
    "if self._entropy_bonus_enabled: effective_mask = mask if entropy_mask is None else mask * entropy_mask",
    # the coefficient, as _apply_coef reads it, and how the term enters the loss
    "if self.use_adaptive_entropy: apply_coef = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target "
    "else 0.0 else: apply_coef = self.entropy_coef loss = loss - apply_coef * entropy_loss",
)


def _form(source):
    """(clamped, rescaled) of the release's token-count normaliser; None where it is not a known form."""
    if source.count(_CLAMPED) == 1 and source.count(_PLAIN) == 0:
        return True, _RESCALED in source
    if source.count(_PLAIN) == 1 and source.count(_CLAMPED) == 0 and _RESCALED not in source:
        return False, False
    return None


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}: unknown loss code")
    source = code(method)
    if "self._entropy_bonus_enabled" not in source:
        return not_needed(f"GRPOTrainer.{METHOD} has no entropy bonus (entropy_coef came with TRL 1.8.0)")
    if _FIXED in source:
        return not_needed("the entropy bonus is a mean over effective_mask for every loss type (fixed code)")
    if source.count(_BUGGY) != 1:
        return undecided(f"the entropy bonus of GRPOTrainer.{METHOD} is not a known line")
    missing = [line for line in _RELIED_ON if line not in source]
    if missing:
        return undecided(f"GRPOTrainer.{METHOD} lacks a line the fix relies on: {missing[0]}")
    if _form(source) is None:
        return undecided(f"the token-count normaliser of GRPOTrainer.{METHOD} is not a known form")
    return needed(
        "with entropy_coef and loss_type dapo/cispo/vespo the entropy bonus is divided by the loss's token-count normaliser, "
        "not averaged over effective_mask and scaled for gradient accumulation; the loss is corrected to TRL 1.10.0's bonus"
    )


def _apply_coef(trainer):
    # TRL's own gating, read before the call: the adaptive update inside it only acts on the next step
    if trainer.use_adaptive_entropy:
        return trainer.entropy_coef if trainer._last_world_entropy <= trainer.args.entropy_target else 0.0
    return trainer.entropy_coef


def _capturing(trainer, seen):
    """Instance-level spies on the two helpers whose results TRL's entropy term uses."""
    saved = {name: vars(trainer)[name] for name in CAPTURED if name in vars(trainer)}
    logps, high = getattr(trainer, CAPTURED[0]), getattr(trainer, CAPTURED[1])

    def entropies(*args, **kwargs):
        out = logps(*args, **kwargs)
        seen["entropies"] = out[1]
        return out

    def entropy_mask(*args, **kwargs):
        seen["entropy_mask"] = out = high(*args, **kwargs)
        return out

    setattr(trainer, CAPTURED[0], entropies)
    setattr(trainer, CAPTURED[1], entropy_mask)

    def restore():
        for name in CAPTURED:
            if name in saved:
                setattr(trainer, name, saved[name])
            else:
                delattr(trainer, name)

    return restore


def _wrap_compute_loss(original, clamped, rescaled):
    signature = inspect.signature(original)
    # the dapo patch, below this one, hands TRL another num_items_in_batch: TRL's normaliser is computed from that
    rescaled_inputs = dapo.rescaled_inputs if dapo.PATCH_ID in markers(original) else None

    @functools.wraps(original)
    def _compute_loss(self, *args, **kwargs):
        if not getattr(self, "_entropy_bonus_enabled", False) or getattr(self, "loss_type", None) not in TOKEN_COUNT_LOSSES:
            return original(self, *args, **kwargs)
        inputs = signature.bind(self, *args, **kwargs).arguments["inputs"]
        coef, train = _apply_coef(self), self.model.training
        seen: dict = {}
        restore = _capturing(self, seen)
        try:
            loss = original(self, *args, **kwargs)
        finally:
            restore()
        mask = inputs["completion_mask"] if "tool_mask" not in inputs else inputs["completion_mask"] * inputs["tool_mask"]
        effective = mask if seen.get("entropy_mask") is None else mask * seen["entropy_mask"]
        total = (seen["entropies"] * effective).sum()
        count = (rescaled_inputs(self, inputs) if rescaled_inputs else inputs)["num_items_in_batch"]
        normalizer = (count.clamp(min=1.0) if clamped else count) / self.accelerator.num_processes
        if rescaled and train:
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        accumulation = self.current_gradient_accumulation_steps if train else 1.0
        return loss + coef * (total / normalizer - total / effective.sum().clamp(min=1.0) / accumulation)

    return _compute_loss


def apply(module, patcher) -> None:
    clamped, rescaled = _form(code(getattr(module.GRPOTrainer, METHOD)))
    patcher.wrap(module.GRPOTrainer, METHOD, lambda original: _wrap_compute_loss(original, clamped, rescaled))
