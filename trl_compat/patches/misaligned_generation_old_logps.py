"""misaligned-generation-old-logps: a buffered batch used after an optimizer step got no old log-probs.

The bug (PR #3725, ``508d551db``, "Fix GRPO sampling logic", fixed in 0.20.0): from 0.18.0
(``steps_per_generation``), ``_prepare_inputs`` generates every ``steps_per_generation *
num_iterations`` micro-steps and hands out the buffered slices, while the optimizer steps every
``gradient_accumulation_steps`` micro-steps. ``_generate_and_score_completions`` skips the old
log-probs (``old_per_token_logps = None``, so ``_compute_loss`` takes ``per_token_logps.detach()``:
ratio 1, no clipping) unless ``num_iterations > 1 or steps_per_generation >
gradient_accumulation_steps``. With ``num_iterations == 1`` and ``gradient_accumulation_steps`` not a
multiple of ``steps_per_generation`` (e.g. 3 and 2), a generation falls inside an accumulation window:
its later slices are trained after the optimizer step, by a model that did not generate them, with
ratio 1 instead of pi_now / pi_generating and without the clip. The buffer itself is aligned: each
slice is the one generated for it.

Upstream fix: old log-probs are computed whenever ``gradient_accumulation_steps % (steps_per_generation
* num_iterations) != 0``.

Probe: ``GRPOTrainer._generate_and_score_completions`` skips them under ``self.num_iterations > 1 or
self.args.steps_per_generation > self.args.gradient_accumulation_steps``: "needed"; the 0.20.0
condition, or no ``steps_per_generation`` (TRL < 0.18): "not needed"; another condition: "undecided".

Fix: in training, where TRL returned ``old_per_token_logps`` None and ``gradient_accumulation_steps %
(steps_per_generation * num_iterations) != 0``, they are computed right after generation, before any
optimizer step, as 0.20.0 computes them inside: ``_get_per_token_logps(self.model, prompt + completion
ids, prompt + completion mask, completion length, per_device_train_batch_size)`` without gradients.
Aligned configurations are returned untouched. Left as the release has it: evaluation, where no
optimizer step falls between generation and loss (0.20.0 computes them there too: ratio 1 either way).

Run time: load-bearing: errors propagate. The old log-probs are the fix: falling back to TRL's own code
on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.20.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

METHOD = "_generate_and_score_completions"
BUGGY = "if self.num_iterations > 1 or self.args.steps_per_generation > self.args.gradient_accumulation_steps:"
FIXED = "self.args.gradient_accumulation_steps % generate_every != 0"


def probe(module):
    source = code(getattr(module.GRPOTrainer, METHOD))
    if BUGGY in source:
        return needed(
            f"GRPOTrainer.{METHOD} skips the old log-probs unless {BUGGY[3:-1]}: with gradient_accumulation_steps "
            "not a multiple of steps_per_generation, slices trained after an optimizer step get ratio 1; "
            "they are computed after generation"
        )
    if FIXED in source or "steps_per_generation" not in source:
        return not_needed(f"GRPOTrainer.{METHOD} computes old log-probs whenever generation and optimizer steps are misaligned")
    return undecided(f"GRPOTrainer.{METHOD} decides on the old log-probs in a way this patch does not know")


def misaligned(args, num_iterations) -> bool:
    """0.20.0's condition: a generation does not start an accumulation window."""
    return args.gradient_accumulation_steps % (args.steps_per_generation * num_iterations) != 0


def _wrap(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if (
            self.model.training
            and isinstance(output, dict)
            and "old_per_token_logps" in output
            and output["old_per_token_logps"] is None
            and misaligned(self.args, self.num_iterations)
        ):
            import torch  # here: the registry imports patch modules where torch may be absent

            completion_ids = output["completion_ids"]
            with torch.no_grad():
                output["old_per_token_logps"] = self._get_per_token_logps(
                    model=self.model,
                    input_ids=torch.cat([output["prompt_ids"], completion_ids], dim=1),
                    attention_mask=torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1),
                    logits_to_keep=completion_ids.size(1),
                    batch_size=self.args.per_device_train_batch_size,
                )
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap)
