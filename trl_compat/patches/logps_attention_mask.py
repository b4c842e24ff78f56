"""logps-attention-mask: TRL 0.14.0 computes log-probs and the KL without the attention mask.

Main-branch builds: 0.15.0.dev0 builds from before PR #2708, main commit bbdd6db17, 2025-02-02 have the bug too.

The bug (PR #2708, "Fix attention masking in GRPO"): in TRL 0.14.0 the function
``get_per_token_logps`` nested in ``GRPOTrainer.compute_loss`` calls the policy and the
reference model as ``model(input_ids, num_logits_to_keep=K + 1)``, without ``attention_mask``.
Prompts are left-padded to the longest prompt of the batch, so whenever the prompts of a device
differ in length the left pads are attended to: the policy's log-probs, the reference's
log-probs and so the KL term are those of a different sequence (generation itself used the
mask). Silent: training runs, on wrong values. TRL 0.15.0 passes
``attention_mask = cat(prompt_mask, completion_mask)``, the completion mask covering the
tokens up to and including the first EOS.

Where it shows: TRL 0.14.0 and the main-branch builds before bbdd6db17 (0.14.0.dev0, early
0.15.0.dev0).

Probe: TRL's log-prob function (see ``trl_compat._helpers.logps_calls``), comments dropped: the
nested ``get_per_token_logps`` calling ``model(input_ids, num_logits_to_keep=...)`` (or
``logits_to_keep=``, early 0.15.0.dev0) with no ``attention_mask`` anywhere in it. A function
that passes ``attention_mask`` is fixed; any other shape is "undecided".

Fix: ``compute_loss`` is wrapped; while it runs, a forward pre-hook on the module TRL calls
(``model``, ``self.ref_model``) adds ``attention_mask`` to the calls made from the nested
function (recognised by its frame, so ``generate``'s forwards are untouched), built the way
TRL 0.15.0 builds it: zeros on the leading run of ``pad_token_id`` in the prompt columns, ones
on the completion up to and including its first ``eos_token_id``. The prompt mask is inferred
from the ids because the nested function only receives the ids; it differs from the
tokenizer's mask only if a prompt itself starts with the pad token.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.14.0 is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import functools
import inspect
import numbers

from trl_compat._engine import needed, undecided
from trl_compat._helpers import logps_calls
from trl_compat._helpers.arguments import arguments

PATCH_ID = "logps-attention-mask"
_KEEP = ("num_logits_to_keep", "logits_to_keep")


def probe(module):
    caller, verdict = logps_calls.unfixed(module.GRPOTrainer, "attention_mask", "passes the attention mask to the model")
    if verdict is not None:
        return verdict
    calls = [name for name in _KEEP if f"model(input_ids, {name}=" in caller.code]
    if caller.kind != logps_calls.NESTED or not calls:
        return undecided(f"{caller.where} passes no attention mask, but calls the model in a way this patch does not know")
    return needed(
        f"{caller.where} calls model(input_ids, {calls[0]}=...) without attention_mask: left-padded "
        "prompt pads are attended to in the policy and reference log-probs (and the KL); the mask "
        "TRL 0.15.0 passes is added to those calls"
    )


def logps_mask(input_ids, completion_length: int, pad_token_id, eos_token_id):
    """TRL 0.15.0's ``cat(prompt_mask, completion_mask)`` for ``input_ids`` = prompt + completion:
    the prompt's leading ``pad_token_id`` run masked, the completion kept up to its first EOS."""
    import torch

    ids = input_ids
    split = ids.size(1) - completion_length
    prompt, completion = ids[:, :split], ids[:, split:]
    if pad_token_id is None:
        prompt_mask = torch.ones_like(prompt)
    else:
        prompt_mask = 1 - (prompt == pad_token_id).long().cumprod(dim=1)
    if eos_token_id is None:
        completion_mask = torch.ones_like(completion)
    else:
        is_eos = (completion == eos_token_id).long()
        completion_mask = ((is_eos.cumsum(dim=1) - is_eos) == 0).long()
    return torch.cat([prompt_mask, completion_mask], dim=1).to(torch.long)


def _pre_hook(trainer, raw):
    def add_mask(module, args, kwargs):
        if kwargs.get("attention_mask") is not None or not logps_calls.called_from(raw):
            return None
        input_ids = arguments(module.forward, *args, **kwargs).get("input_ids")
        keep = next((kwargs[name] for name in _KEEP if name in kwargs), None)
        if input_ids is None or getattr(input_ids, "dim", lambda: 0)() != 2 or not isinstance(keep, numbers.Integral):
            return None
        tokenizer = getattr(trainer, "processing_class", None)
        tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
        mask = logps_mask(input_ids, int(keep) - 1, getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None))
        return args, {**kwargs, "attention_mask": mask.to(input_ids.device)}

    return add_mask


def apply(module, patcher) -> None:
    caller = logps_calls.find(module.GRPOTrainer)

    def factory(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def compute_loss(self, *args, **kwargs):
            try:
                model = signature.bind_partial(self, *args, **kwargs).arguments.get("model")
            except TypeError:
                model = None
            with logps_calls.hooked([model, getattr(self, "ref_model", None)], pre=_pre_hook(self, caller.raw)):
                return original(self, *args, **kwargs)

        return compute_loss

    patcher.wrap(module.GRPOTrainer, "compute_loss", factory)
