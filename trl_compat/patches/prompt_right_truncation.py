"""prompt-right-truncation: TRL 0.24.0 - 0.25.1 cut the END of long prompts (tokenizer passed by the user).

Upstream: PR #4300, main commit ca21dd94c, 2025-12-08, released in 0.26.0, removed the
max_prompt_length truncation.

The bug (no TRL issue; Unsloth's ``rl_replacements.py`` carries a "TRL 0.24.0-0.25.1 truncation
regression fix"): PR #4153 (main commit 0e57b4a9d, 2025-10-10, first released in 0.24.0) replaced
TRL's own left truncation (``truncate_with_protected_tokens``, the last ``max_prompt_length`` ids)
with the tokenizer's: the transformers generation path (no vLLM) tokenises the prompts with
``max_length=self.max_prompt_length, truncation=True`` (0.24.0: ``processing_class(text=...)``;
0.25.x: ``apply_chat_template(...)``, the paged path too). Which end the tokenizer cuts is its
``truncation_side``. TRL sets ``truncation_side="left"`` only on a processor it loads itself
(``AutoProcessor.from_pretrained(..., truncation_side="left")``); a tokenizer the user passes (the
common case) truncates on the RIGHT, its default. A prompt longer than ``max_prompt_length`` (default
512) loses its end: the question's tail and the chat template's generation header
(``<|im_start|>assistant``). Generation and the loss use the same ids (not off-policy), but the model
is trained to continue a cut question. vLLM is not affected: it gets ``truncate_prompt_tokens``,
which keeps the last ids.

Where it shows: TRL 0.24.0 - 0.25.1 with ``use_vllm=False`` (the default), a passed tokenizer whose
``truncation_side`` is not "left", and prompts over ``max_prompt_length``; the main-branch builds
from 0e57b4a9d to ca21dd94c. 0.14 - 0.23 truncate on the left themselves; 0.26.0+ do not truncate.

Probe (the code; the tokenizer's side is read per trainer at run time): ``GRPOTrainer`` passes
``max_length=self.max_prompt_length`` (or ``"max_length": self.max_prompt_length``) with
``truncation=True`` to the tokenizer and sets no ``.truncation_side = "left"`` on a tokenizer it is
given. "not needed" where TRL truncates itself (``-self.max_prompt_length`` /
``truncate_with_protected_tokens``) or not at all, or sets the side itself.

Fix: after ``GRPOTrainer.__init__`` (``_helpers.trainer_init.around_init``), a trainer that generates
with transformers (``use_vllm`` false) gets ``truncation_side = "left"`` on its processing class and
on the processor's ``.tokenizer``, which is TRL's own choice when it loads one, with a warning
naming the old side. The user's tokenizer object is changed (as TRL changes its pad token). The vLLM
path is left alone.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.24.x and 0.25.x are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import logging

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "prompt-right-truncation"
LEFT = "left"
_TOKENIZER_TRUNCATES = ("max_length=self.max_prompt_length", '"max_length": self.max_prompt_length')
_TRUNCATION_ON = ("truncation=True", '"truncation": True')
_OWN_TRUNCATION = ("-self.max_prompt_length", "truncate_with_protected_tokens")


def probe(module):
    source = code(module.GRPOTrainer)
    if not (any(n in source for n in _TOKENIZER_TRUNCATES) and any(n in source for n in _TRUNCATION_ON)):
        if any(n in source for n in _OWN_TRUNCATION):
            return not_needed("GRPOTrainer truncates prompts itself, keeping their last max_prompt_length ids")
        return not_needed("GRPOTrainer does not truncate prompts to max_prompt_length")
    if '.truncation_side = "left"' in source:
        return not_needed("GRPOTrainer sets truncation_side = 'left' on the tokenizer it truncates prompts with")
    return needed(
        "GRPOTrainer truncates prompts with the tokenizer (max_length=self.max_prompt_length, truncation=True) "
        "but sets truncation_side='left' only on a processor it loads itself: a passed tokenizer (side 'right', "
        "the default) cuts the end of prompts longer than max_prompt_length, generation header included; "
        "truncation_side='left' is set on the trainer's tokenizer (transformers generation path only)"
    )


def _tokenizers(processing_class):
    seen = []
    for obj in (processing_class, getattr(processing_class, "tokenizer", None)):
        if obj is not None and hasattr(obj, "truncation_side") and all(obj is not s for s in seen):
            seen.append(obj)
    return seen


def truncate_left(processing_class) -> list:
    """Set ``truncation_side = "left"`` on ``processing_class`` and its ``.tokenizer``; the old sides changed."""
    changed = []
    for tokenizer in _tokenizers(processing_class):
        if tokenizer.truncation_side != LEFT:
            changed.append(tokenizer.truncation_side)
            tokenizer.truncation_side = LEFT
    return changed


def _after(trainer, arguments) -> None:
    if getattr(trainer, "use_vllm", False):
        return  # vLLM truncates with truncate_prompt_tokens, keeping the last ids
    changed = truncate_left(getattr(trainer, "processing_class", None))
    if changed:
        log.warning(
            "trl_compat: %s: the tokenizer truncated prompts longer than max_prompt_length on the %s; "
            "truncation_side set to 'left' (keep the prompt's end and generation header), as TRL does for one it loads",
            PATCH_ID,
            changed[0],
        )


apply = around_init(after=_after)
