"""dapo-masked-token-normalizer: the DAPO/CISPO/VESPO normaliser counts tokens the loss masks out.

The bug (fixed by PR #6439, 7c1fa85ad, in 1.9.0): the ``"dapo"`` loss (the default from 0.22.0;
``"cispo"`` from 0.26.0 and ``"vespo"`` from 1.0.0 share it) divides the summed token loss by
``num_items_in_batch``, which ``_generate_and_score_completions`` counts as the completion lengths
up to EOS, gathered over processes: ``num_items_in_batch = agg_completion_lengths.sum()`` in
0.22 - 0.23 (2324245ca, PR #3938), ``total_completion_tokens = agg_completion_lengths.sum()``
returned by ``_generate`` from 0.24.0 to 1.8.0. That count is taken before
``mask_truncated_completions=True`` zeroes the ``completion_mask`` (and, with tools, the
``tool_mask``) of every completion without EOS; tool-result tokens themselves are already left out
of it (the lengths are ``sum(tool_mask)`` from 0.26.0, when tools arrived). The loss sums only
unmasked tokens, so the normaliser is too large: gradients shrink by the truncated share of the
batch, which varies from step to step. No error.

Upstream fix: ``loss_mask = completion_mask if tool_mask is None else completion_mask *
tool_mask`` after the masking, ``num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()``,
and ``.clamp(min=1.0)`` on the normaliser in ``_compute_loss`` (a batch masked out entirely).

Probe: ``GRPOTrainer._generate_and_score_completions`` returns ``"num_items_in_batch":
num_items_in_batch`` and applies ``self.mask_truncated_completions``, and either it or
``GRPOTrainer._generate`` counts ``agg_completion_lengths.sum()``: "needed". The fixed code
(``loss_mask.sum()``) gives "not needed"; anything else "undecided".

Fix: ``GRPOTrainer._generate_and_score_completions`` is wrapped; after TRL's code the returned
batch's ``num_items_in_batch`` is recomputed from the masks it returns, as 1.9.0 does:
``gather((completion_mask * tool_mask).sum()).sum()`` (``tool_mask`` where present), at least 1,
so that a batch masked out entirely keeps its loss of 0 (TRL 1.9.0 clamps at the same point).
Where nothing is masked the value equals TRL's. The method runs on every process (the gather is
collective, as TRL's own is at that point).

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 1.9.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "dapo-masked-token-normalizer"
METHOD = "_generate_and_score_completions"
COUNTING = ("_generate_and_score_completions", "_generate")

_RETURNS = '"num_items_in_batch": num_items_in_batch'
_MASKS = "self.mask_truncated_completions"
_COUNTS_LENGTHS = "= agg_completion_lengths.sum()"
_FIXED = "loss_mask.sum()"


def probe(module):
    cls = module.GRPOTrainer
    method = getattr(cls, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}: unknown generation code")
    generate = code(method)
    if _FIXED in generate:
        return not_needed("num_items_in_batch counts the tokens of the loss mask (fixed code)")
    if _RETURNS not in generate:
        return undecided(f"GRPOTrainer.{METHOD} returns no num_items_in_batch as TRL 0.22 - 1.8 do")
    if _MASKS not in generate:
        return undecided(f"GRPOTrainer.{METHOD} has no mask_truncated_completions: unknown masking code")
    counters = [name for name in COUNTING if getattr(cls, name, None) is not None and _COUNTS_LENGTHS in code(getattr(cls, name))]
    if not counters:
        return undecided("num_items_in_batch is counted in an unknown way")
    return needed(
        f"num_items_in_batch is the sum of the completion lengths (GRPOTrainer.{counters[0]}), counted before "
        "mask_truncated_completions and the tool mask: the dapo/cispo/vespo normaliser includes tokens the loss "
        "masks out; it is recounted from the returned masks, as TRL 1.9.0 does"
    )


def loss_token_count(trainer, output):
    """The tokens the loss sums over, all processes: ``completion_mask`` (times ``tool_mask``), at least 1."""
    mask = output["completion_mask"]
    tool_mask = output.get("tool_mask")
    if tool_mask is not None:
        mask = mask * tool_mask
    return trainer.accelerator.gather(mask.sum()).sum().clamp(min=1)


def _wrap_generate_and_score(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        output = original(self, *args, **kwargs)
        if isinstance(output, dict) and "num_items_in_batch" in output and "completion_mask" in output:
            output["num_items_in_batch"] = loss_token_count(self, output)
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap_generate_and_score)
