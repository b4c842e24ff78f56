"""vlm-mm-token-type-ids: a VLM processor that returns ``mm_token_type_ids`` (1 at image tokens, 2 at video
tokens) breaks GRPO's log-prob forwards: TRL 0.24 - 0.28 raise ``TypeError`` where the old or the reference
log-probs are computed, 0.29.0 an ``IndexError`` in the model, and the loss's forward never gets them.

The bug
    From TRL 0.24.0 (PR #4114, ``9603b41d7``) the prompts' processor output, minus ``input_ids`` and
    ``attention_mask``, is ``forward_kwargs``, handed as ``**forward_kwargs`` to
    ``_get_per_token_logps_and_entropies`` for the old log-probs (``num_iterations > 1``, misaligned
    ``gradient_accumulation_steps``, vLLM's importance-sampling correction) and the reference model's
    (``beta != 0``). That function names the keys it knows (``pixel_values``, ``image_grid_thw``,
    ``token_type_ids``, ...); ``mm_token_type_ids`` is none of them. Processors that return it unasked:
    transformers 5's (ERNIE-4.5-VL's; Qwen2-VL's, Qwen2.5-VL's, Qwen3-VL's and GLM-4V's from 5.3, whose
    models read them for the multimodal RoPE; 4.x returns them only on request, which GRPO never makes).
    Three faults, in the releases of this patch's window:

    - 0.24.0 - 0.28.x: ``TypeError: GRPOTrainer._get_per_token_logps_and_entropies() got an unexpected
      keyword argument 'mm_token_type_ids'`` at the first old or reference log-probs.
    - 0.29.0: PR #5176 (``0b2cd5c04``) takes them and hands each chunk's to the model, but they cover the
      prompt only while the ids are prompt + completion: the model's ``get_rope_index`` (transformers >= 5.3)
      indexes them with the attention mask, ``IndexError: The shape of the mask [P + C] at index 0 does not
      match the shape of the indexed tensor [P] at index 0``.
    - both: ``_generate_and_score_completions`` does not return them and ``_compute_loss`` does not pass
      them, so the loss's forward runs without them: transformers 5.3 - 5.x's Qwen2-VL then takes the
      positions from the ``rope_deltas`` its last generation left (silently other log-probs than the
      sampling model's), later ones refuse (``ValueError: ... mm_token_type_ids is missing``).

    Upstream: PR #5176 (0.29.0) and PR #5178 (``1919c00d3``, cherry-picked as ``b2b3045df``; fixed in
    0.29.1): ``forward_kwargs["mm_token_type_ids"]`` is extended with zeros over the completion, returned in
    the batch, and ``_compute_loss`` passes ``mm_token_type_ids=inputs.get("mm_token_type_ids")``. One
    patch for the two PRs: #5176 alone is 0.29.0, which turns the ``TypeError`` into the ``IndexError``
    (and leaves the loss without them); the fix is one route, from the processor to every log-prob forward.
    Not covered: ERNIE-4.5-VL's second key, ``moe_mm_token_type_ids``, which no TRL release takes.

How the probe recognises it
    ``GRPOTrainer`` builds ``forward_kwargs`` from the processor's output (``{k: v for k, v in
    prompt_inputs.items() if k not in ["input_ids", "attention_mask"]}``) and
    ``_generate_and_score_completions`` hands it on as ``**forward_kwargs``, without extending
    ``forward_kwargs["mm_token_type_ids"]``, while ``_compute_loss`` hands the log-prob call its image
    inputs by name (``image_grid_thw=inputs.get("image_grid_thw")``): needed (the reason says whether the
    log-prob function takes them: 0.29.0). The extension there and
    ``mm_token_type_ids=inputs.get("mm_token_type_ids")`` in ``_compute_loss``: not needed (PR #5178).
    No ``forward_kwargs`` handed on (TRL < 0.24 names each image input): not needed. The extension without
    the loss's argument, or a ``_compute_loss`` of another shape: undecided.

The fix
    What PR #5178 does, from outside. For a batch with images, ``_generate_and_score_completions`` runs with
    the trainer's processor recording the ``mm_token_type_ids`` of each call that processed images (its
    class swapped, for the call only, for a subclass that notes the output), and
    ``_get_per_token_logps_and_entropies`` takes ``mm_token_type_ids`` out of its keyword arguments: they
    are widened to the ids with zeros over the completion (``logits_to_keep`` columns) and reach the model
    as TRL 0.29.1 hands them, each chunk's rows with its forward (0.29.0: handed to TRL's function, which
    takes them; 0.24 - 0.28: added to the model call by a forward pre-hook held for the call only). The batch
    ``_generate_and_score_completions`` returns gets ``mm_token_type_ids`` (those a log-prob call was handed,
    else the last recorded ones whose shape is the prompts'), widened over the completion; TRL's shuffle and
    split keep them row for row with the ids, and while ``_compute_loss`` runs, its log-prob call gets them.
    A batch without images, or a processor that returns no ``mm_token_type_ids``, runs as TRL has it.

Run time: load-bearing: errors propagate. Handing the model its ``mm_token_type_ids`` is the fix: falling
back to TRL's code on an error would be the bug (``trl_compat._engine.guarded``). Two deliberate, announced
exceptions, each with a warning once: ``mm_token_type_ids`` whose shape fits neither the ids nor the prompt
(then the forward runs without them, as the loss's does unpatched, rather than raising), and a processor
whose class cannot be swapped (then only a log-prob call's can reach the batch).

Delete when: trl_compat no longer supports TRL 0.24 - 0.29.0 on transformers 5 (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Mapping

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.logps_calls import hooked
from trl_compat._helpers.source import code
from trl_compat.patches.vlm_mm_token_type_ids.batch import _BATCH, _LOSS, KEY, _unfit, _wrap_score, widened

log = logging.getLogger(__name__)

LOGPS = "_get_per_token_logps_and_entropies"
SCORE = "_generate_and_score_completions"
LOSS = "_compute_loss"

BUILDS = 'forward_kwargs = {k: v for k, v in prompt_inputs.items() if k not in ["input_ids", "attention_mask"]}'
HANDS_ON = "**forward_kwargs"
EXTENDED = 'forward_kwargs["mm_token_type_ids"] = torch.cat('  # PR #5178
LOSS_PASSES = 'mm_token_type_ids=inputs.get("mm_token_type_ids")'  # PR #5178
LOSS_SHAPE = 'image_grid_thw=inputs.get("image_grid_thw")'  # the loss hands the log-prob call its image inputs by name
TAKES = "mm_token_type_ids=None"  # PR #5176, in the log-prob function's signature


def probe(module):
    trainer = module.GRPOTrainer
    score = getattr(trainer, SCORE, None)
    if score is None or BUILDS not in code(trainer) or HANDS_ON not in code(score):
        return not_needed("GRPOTrainer hands the log-prob calls its image inputs by name, not the processor's output (TRL < 0.24)")
    loss = getattr(trainer, LOSS, None)
    loss_code = code(loss) if loss is not None else ""
    if EXTENDED in code(score):
        if LOSS_PASSES in loss_code:
            return not_needed("TRL extends mm_token_type_ids over the completion and hands them to the loss (PR #5178)")
        return undecided(f"TRL extends mm_token_type_ids but GRPOTrainer.{LOSS} does not pass them in a way this patch knows")
    if LOSS_SHAPE not in loss_code:
        return undecided(f"GRPOTrainer.{LOSS} calls the log-prob function in a way this patch does not know")
    if TAKES in code(getattr(trainer, LOGPS)):
        return needed(
            "the log-prob calls get the processor's mm_token_type_ids for the prompt only (IndexError in the model's "
            "get_rope_index) and the loss gets none: they are widened over the completion and handed to every forward"
        )
    return needed(
        f"GRPOTrainer.{LOGPS} rejects the processor's mm_token_type_ids (TypeError: unexpected keyword argument) and "
        "the loss gets none: they are widened over the completion and handed to every forward"
    )


# -- the state of one call ---------------------------------------------------------------------------


# -- the log-prob function and the loss ------------------------------------------------------------------


def _feeding(mm):
    """A forward pre-hook that adds each call's rows of ``mm`` (TRL calls the model chunk by chunk, in order)."""
    start = 0

    def pre(_module, args, kwargs):
        nonlocal start
        ids = kwargs.get("input_ids")
        if ids is None or kwargs.get(KEY) is not None:
            return None
        rows = ids.shape[0]
        kwargs = {**kwargs, KEY: mm[start : start + rows].to(ids.device)}
        start += rows
        return args, kwargs

    return pre


def _wrap_logps(original):
    takes = KEY in inspect.signature(original).parameters  # 0.29.0 (PR #5176)

    @functools.wraps(original)
    def _get_per_token_logps_and_entropies(self, *args, **kwargs):
        mm = kwargs.pop(KEY, None)
        handed = mm is not None
        if mm is None:
            loss = _LOSS.get()
            if loss is None or loss[0] is not self:
                return original(self, *args, **kwargs)
            mm = loss[1]
        bound = arguments(original, self, *args, **kwargs)
        if takes and KEY in bound:  # handed by position: TRL's own call, left to it
            return original(self, *args, **kwargs)
        input_ids, keep = bound.get("input_ids"), bound.get("logits_to_keep")
        rows, width = input_ids.shape[0], input_ids.shape[1]
        wide = widened(mm, rows, width, int(keep or 0), input_ids.device)
        if wide is None:
            _unfit(mm, rows, width)
            return original(self, *args, **kwargs)
        batch = _BATCH.get()
        if handed and batch is not None and batch.trainer is self:
            batch.handed = wide
        if takes:
            return original(self, *args, **kwargs, **{KEY: wide})
        with hooked([bound.get("model")], pre=_feeding(wide)):
            return original(self, *args, **kwargs)

    return _get_per_token_logps_and_entropies


def _wrap_loss(original):
    @functools.wraps(original)
    def _compute_loss(self, *args, **kwargs):
        inputs = arguments(original, self, *args, **kwargs).get("inputs")
        mm = inputs.get(KEY) if isinstance(inputs, Mapping) else None
        if mm is None:
            return original(self, *args, **kwargs)
        token = _LOSS.set((self, mm))
        try:
            return original(self, *args, **kwargs)
        finally:
            _LOSS.reset(token)

    return _compute_loss


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, LOGPS, _wrap_logps)
    patcher.wrap(module.GRPOTrainer, SCORE, _wrap_score)
    patcher.wrap(module.GRPOTrainer, LOSS, _wrap_loss)
