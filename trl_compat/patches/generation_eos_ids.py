"""generation-eos-ids: without vLLM, only the tokenizer's EOS ends a completion; the end-of-turn ids a
model declares in ``generation_config.eos_token_id`` (Llama 3's ``<|eot_id|>``, Gemma's
``<end_of_turn>``) neither stop ``generate`` nor the completion mask.

Upstream: no PR in TRL's readable history; the change is in the 1.14.2 wheel
(``trl/trainer/grpo_trainer.py``, 1.14.1 -> 1.14.2): ``__init__`` collects
``self.eos_token_ids`` (the tokenizer's EOS, then every id of ``model.generation_config.eos_token_id``),
the transformers ``GenerationConfig`` takes that list, and the completion mask is
``torch.isin(completion_ids, self.eos_token_ids)``.

The bug: from 0.16.0 TRL builds its ``GenerationConfig`` with ``eos_token_id=tokenizer.eos_token_id``,
which replaces the model's list, so ``generate`` runs past an end-of-turn token; the mask
(``is_eos = completion_ids == <tokenizer's EOS>``, there since 0.14.0) then keeps every token after it.
For a model whose tokenizer EOS is not its end-of-turn token (Gemma instruct: ``<eos>`` vs
``<end_of_turn>``; checkpoints that declare several eos ids), the tokens sampled after the end of
the turn are scored by the reward functions and trained on by the loss. This patch acts from 0.24.0,
where the mask is computed in ``_generate_single_turn``; 0.14 - 0.23 compute it inline in
``_generate_and_score_completions`` and keep the bug.

Probe: ``GRPOTrainer._generate_single_turn`` computes ``is_eos = completion_ids ==
self.eos_token_id`` (0.24 - 1.0) or ``== self._tokenizer.eos_token_id`` (1.x) and returns the completion
ids as ``return prompt_ids, completion_ids, logprobs, ...`` (0.24 - 0.29) or ``return completion_ids,
logprobs`` (1.x): "needed". ``self.eos_token_ids`` or ``torch.isin(completion_ids`` in it (1.14.2):
"not needed". Anything else (no such method, another return form): "undecided".

Fix: after TRL's ``__init__``, the ids the model declares are collected (the tokenizer's EOS first,
as 1.14.2 does); where they add any and TRL built a transformers ``GenerationConfig``, its
``eos_token_id`` (and ``generation_kwargs``' where present) becomes that list, so ``generate`` stops at
any of them. ``_generate_single_turn`` is wrapped: on the transformers path (not vLLM, not
``use_transformers_paged``) each completion's ids are cut after the first declared id, which is the
completion mask 1.14.2 computes. Its bookkeeping runs inside ``guarded``: an error leaves TRL's
completions as they were. Not covered: vLLM (its engine stops at the ids of the model's generation
config), paged generation, the ``completions/clipped_ratio`` metric and ``mask_truncated_completions``
(which still count only the tokenizer's EOS as an end).

Delete when: trl_compat no longer supports TRL < 1.14.2 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import logging

from trl_compat._engine import guarded, needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "generation-eos-ids"
log = logging.getLogger(__name__)

METHOD = "_generate_single_turn"
BUGGY_MASKS = ("is_eos = completion_ids == self.eos_token_id", "is_eos = completion_ids == self._tokenizer.eos_token_id")
FIXED = ("self.eos_token_ids", "torch.isin(completion_ids")
# where the completion ids sit in _generate_single_turn's result: 0.24 - 0.29, 1.x
RETURNS = {"return prompt_ids, completion_ids, logprobs,": 1, "return completion_ids, logprobs": 0}
END_IDS = "_trl_compat_end_ids"


def _completion_index(source) -> int | None:
    for form, index in RETURNS.items():
        if form in source:
            return index
    return None


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}")
    source = code(method)
    if any(marker in source for marker in FIXED):
        return not_needed(f"GRPOTrainer.{METHOD} ends a completion at every eos id the model declares (TRL 1.14.2)")
    if not any(mask in source for mask in BUGGY_MASKS) or _completion_index(source) is None:
        return undecided(f"GRPOTrainer.{METHOD} does not compute the completion mask the way this patch expects")
    return needed(
        f"GRPOTrainer.{METHOD} ends a completion only at the tokenizer's EOS: end-of-turn ids declared in the "
        "model's generation_config.eos_token_id stop neither generate nor the completion mask; the patch adds "
        "them to TRL's generation config and cuts each completion after the first one"
    )


def _declared_ids(trainer) -> list[int]:
    """The tokenizer's EOS (what TRL put in its GenerationConfig), then the model's declared eos ids."""
    first = trainer.generation_config.eos_token_id
    declared = getattr(getattr(trainer.model, "generation_config", None), "eos_token_id", None)
    declared = [] if declared is None else [declared] if isinstance(declared, int) else list(declared)
    return list(dict.fromkeys([first, *declared] if first is not None else declared))


def _after_init(trainer, arguments) -> None:
    with guarded(PATCH_ID, "collecting the model's eos ids", logger=log):
        if getattr(trainer, "use_vllm", False) or getattr(trainer, "generation_config", None) is None:
            return
        ids = _declared_ids(trainer)
        if ids == [trainer.generation_config.eos_token_id]:
            return  # the model declares nothing more than the tokenizer's EOS
        trainer.generation_config.eos_token_id = ids
        kwargs = getattr(trainer, "generation_kwargs", None)
        if isinstance(kwargs, dict) and "eos_token_id" in kwargs:
            kwargs["eos_token_id"] = ids
        setattr(trainer, END_IDS, frozenset(ids))


def _cut(completions: list[list[int]], ends: frozenset) -> list[list[int]]:
    cut = []
    for ids in completions:
        end = next((i for i, token in enumerate(ids) if token in ends), None)
        cut.append(ids if end is None else ids[: end + 1])
    return cut


def _wrapper(original, index: int):
    @functools.wraps(original)
    def _generate_single_turn(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        with guarded(PATCH_ID, "cutting completions at the declared eos ids", fallback="the completions keep TRL's mask", logger=log):
            ends = getattr(self, END_IDS, None)
            if ends and not getattr(self, "use_transformers_paged", False) and not getattr(self, "use_vllm", False):
                result = (*result[:index], _cut(result[index], ends), *result[index + 1 :])
        return result

    return _generate_single_turn


def apply(module, patcher) -> None:
    index = _completion_index(code(getattr(module.GRPOTrainer, METHOD)))
    if index is None:  # the probe read one: the code changed under it
        raise RuntimeError(f"GRPOTrainer.{METHOD} no longer returns the completion ids in a form this patch knows")
    around_init(after=_after_init)(module, patcher)
    patcher.wrap(module.GRPOTrainer, METHOD, lambda original: _wrapper(original, index))
