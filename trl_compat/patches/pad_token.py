"""pad-token: GRPO with a tokenizer that has no pad token dies at the first step.

Main-branch builds: 0.17.0.dev0 builds from before PR #3290, main commit 1faa7f9b3, 2025-04-22 have the bug too.

The bug (issue #3287, fixed by PR #3290): GRPOTrainer left-pads the prompts of a batch with
``processing_class(prompts_text, padding=True, ...)``. A tokenizer without a pad token (GPT-2,
Llama-3 base, many base models) raises ``ValueError: Asking to pad but the tokenizer does not have
a padding token`` at the first training step (TRL also builds its ``GenerationConfig`` with
``pad_token_id=None``). TRL 0.17.0 sets ``processing_class.pad_token = processing_class.eos_token``
in ``__init__`` when it is unset, for a tokenizer the user passes as well as one TRL loads
(``if processing_class.pad_token is None`` sits after, not inside, ``if processing_class is None``;
0.20 moved it to ``tokenizer.pad_token``), so 0.17.0 is the first fixed release for both.

Where it shows: TRL 0.14.0 - 0.16.1 and the main-branch builds before 1faa7f9b3.

Probe: ``GRPOTrainer.__init__`` (comments dropped) never sets
``processing_class.pad_token = processing_class.eos_token`` (nor ``tokenizer.pad_token = ...``).

Fix: ``GRPOTrainer.__init__`` is wrapped. A tokenizer passed in without a pad token gets
``pad_token = eos_token`` before TRL reads it, as TRL 0.17 does, with a warning; one TRL loaded
itself is fixed after ``__init__``, together with the ``pad_token_id`` of TRL's
``generation_config``. The prompt pads are then EOS tokens, which the attention mask hides
(TRL masks completions after their first EOS already). A tokenizer with neither token is left alone.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.16.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import logging
import re

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "pad-token"
# `processing_class.pad_token = processing_class.eos_token` (0.17 - 0.19), `tokenizer.pad_token = ...` (0.20+);
# not `reward_processing_class.pad_token = ...`, which every version has.
_FIXED = re.compile(r"(?<![\w.])(processing_class|tokenizer) \. pad_token = \1 \. eos_token")


def probe(module):
    if _FIXED.search(code(module.GRPOTrainer.__init__)):
        return not_needed("GRPOTrainer.__init__ sets pad_token = eos_token when the tokenizer has none")
    return needed(
        "GRPOTrainer.__init__ never sets a missing pad token: a tokenizer without one fails at the first "
        "step with 'Asking to pad but the tokenizer does not have a padding token'; pad_token = "
        "eos_token is set, as TRL 0.17 does"
    )


def _tokenizer(processing_class):
    return getattr(processing_class, "tokenizer", processing_class)  # a processor wraps its tokenizer


def set_pad_token(processing_class) -> bool:
    """``pad_token = eos_token`` on a tokenizer that has no pad token but an EOS; True if set."""
    tokenizer = _tokenizer(processing_class)
    if tokenizer is None or not hasattr(tokenizer, "pad_token"):
        return False
    if getattr(tokenizer, "pad_token", None) is not None or getattr(tokenizer, "eos_token", None) is None:
        return False
    tokenizer.pad_token = tokenizer.eos_token
    log.warning(
        "trl_compat: %s: the tokenizer has no pad token; using its EOS token %r as pad token, as TRL 0.17 does",
        PATCH_ID,
        tokenizer.eos_token,
    )
    return True


def _before(trainer, arguments) -> None:
    set_pad_token(arguments.get("processing_class"))


def _after(trainer, arguments) -> None:
    if arguments.get("processing_class") is None and set_pad_token(getattr(trainer, "processing_class", None)):
        # TRL loaded the tokenizer itself and built its GenerationConfig from the missing pad id.
        generation_config = getattr(trainer, "generation_config", None)
        if generation_config is not None and getattr(generation_config, "pad_token_id", 0) is None:
            generation_config.pad_token_id = _tokenizer(trainer.processing_class).pad_token_id


apply = around_init(before=_before, after=_after)
