"""What TRL asks for: the name it passes the model the number of logits to keep under, and
whether it slices the logits itself afterwards, read from the installed TRL's code."""

from __future__ import annotations

import re
from typing import NamedTuple

from trl_compat._helpers.source import code

PATCH_ID = "logits-to-keep"
NEW = "logits_to_keep"  # transformers >= 4.49
OLD = "num_logits_to_keep"  # transformers <= 4.51
NEXT = "_get_per_token_logps_and_entropies"  # TRL 0.20's entry point (PR #3563, 7e8ef867a)
NAMES = (NEW, OLD)


class TrlCall(NamedTuple):
    """What the installed TRL does, read from its source by the probe."""

    passed: str  # the kwarg name TRL passes to the model
    fallback: bool  # whether TRL slices the logits itself afterwards
    entry: str  # the GRPOTrainer method wrapped to prepare the models before TRL calls them
    caller: str  # the GRPOTrainer method whose code calls the models (its source was read)


_PASS_RE = re.compile(r"\b(num_logits_to_keep|logits_to_keep)\s*=\s*(?:num_logits_to_keep|logits_to_keep)\s*\+\s*1\b")
_FALLBACK_RE = re.compile(r"\blogits\s*=\s*logits\s*\[\s*:\s*,\s*-\s*(?:num_logits_to_keep|logits_to_keep)\s*:\s*\]")


def _caller(trainer_cls) -> tuple[str, str | None]:
    """The method whose code calls the models, and its code."""
    for name, must_contain in (("_get_per_token_logps", None), ("compute_loss", "def get_per_token_logps")):
        fn = getattr(trainer_cls, name, None)
        if fn is None:
            continue
        text = code(fn)  # unwraps decorators and other patches' wrappers
        if must_contain is None or must_contain in text:
            return name, text
    return "", None


def read_trl(module) -> tuple[TrlCall | None, str]:
    """``(TrlCall, "")`` or ``(None, why not)`` for the loaded ``trl.trainer.grpo_trainer``."""
    caller, text = _caller(module.GRPOTrainer)
    if not caller or text is None:
        return None, "GRPOTrainer has neither _get_per_token_logps nor a compute_loss with a nested get_per_token_logps"
    passed = set(_PASS_RE.findall(text))
    if len(passed) != 1:
        return None, (
            f"GRPOTrainer.{caller} passes {sorted(passed) or 'neither logits_to_keep nor num_logits_to_keep'}"
            " as `<name>=<name> + 1`; expected exactly one"
        )
    # 0.15+: the method that calls the models gets the model as an argument: wrap it. 0.14.0: the
    # caller is a function nested in compute_loss (which vllm-lora-names wraps too); wrap
    # _prepare_inputs instead, which transformers' training_step and prediction_step (and
    # grpo-eval-0.14's) call right before compute_loss, and prepare the trainer's models there.
    entry = caller if caller == "_get_per_token_logps" else "_prepare_inputs"
    return TrlCall(passed.pop(), bool(_FALLBACK_RE.search(text)), entry, caller), ""
