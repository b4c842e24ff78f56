"""Record TRL's log-prob forwards in a real GRPO run, with independent references computed at once.

``LogpsCalls(trainer)`` puts a forward hook on the trainer's policy module (``trainer.model``: full
fine-tuning on one process, so it is also the module TRL calls) and on ``trainer.ref_model``. It
keeps only the calls made from TRL's log-prob function (``_get_per_token_logps`` in 0.15+, the
function nested in ``compute_loss`` in 0.14.0: its frame is on the stack), never ``generate``'s.
For each call it records the ids, the attention mask the model received, the output object TRL
gets back (read after the call: what TRL computed its log-probs from), and references computed in
the hook from a plain, hook-free forward of the same weights:

* ``unpadded``: per row, the log-probs of the completion tokens from a forward of the row with its
  leading pad tokens removed (no mask needed). Qwen2/Llama use rotary positions, so a correctly
  masked left-padded row gives the same values (the test prompts never contain the pad token).
* ``masked``: from a forward with the attention mask the model received (at temperature 1).
"""

from __future__ import annotations

import types

import torch

KEEP = ("num_logits_to_keep", "logits_to_keep")


def trl_logps_function_code():
    """The code object of the installed TRL's log-prob function (where it calls the models)."""
    from trl_compat._helpers import logps_calls

    from trl.trainer.grpo_trainer import GRPOTrainer

    caller = logps_calls.find(GRPOTrainer)
    assert caller is not None
    return caller.raw


def on_stack(raw) -> bool:
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is raw:
            return True
        frame = frame.f_back
    return False


def logps_from_logits(logits, ids, k, temperature=1.0):
    """TRL's formula: drop the last position, keep the last k, log-softmax, gather the next tokens."""
    logits = logits[:, :-1][:, -k:].float() / temperature
    return torch.gather(logits.log_softmax(-1), 2, ids[:, -k:, None])[..., 0]


def plain_logits(module, **kwargs):
    """A forward without module hooks (ours included) and without trl_compat's per-instance wrappers."""
    inner = module.module if hasattr(module, "module") else module
    with torch.no_grad():
        return type(inner).forward(inner, **kwargs).logits


class LogpsCalls:
    def __init__(self, trainer, pad_token_id, temperature=1.0):
        self.raw = trl_logps_function_code()
        self.pad = pad_token_id
        self.temperature = temperature
        self.calls = []
        self.others = []  # (output, its logits when this hook saw them) of the policy's other forwards
        self.handles = []
        for role, module in (("policy", trainer.model), ("ref", getattr(trainer, "ref_model", None))):
            if isinstance(module, torch.nn.Module):
                self.handles.append(module.register_forward_hook(self._hook(role), with_kwargs=True))

    def _hook(self, role):
        def record(module, args, kwargs, output):
            if not on_stack(self.raw):
                # another forward of the same module (generate's): keep what it returned, to check
                # later that nothing changed it after this hook
                if role == "policy" and getattr(output, "logits", None) is not None and len(self.others) < 64:
                    self.others.append((output, output.logits.detach().clone()))
                return
            ids = args[0] if args else kwargs["input_ids"]
            keep = next(kwargs[name] for name in KEEP if name in kwargs)
            k = int(keep) - 1
            mask = kwargs.get("attention_mask")
            unpadded = []
            for row in ids:
                start = int((row != self.pad).long().argmax()) if self.pad is not None else 0
                logits = plain_logits(module, input_ids=row[None, start:])
                unpadded.append(logps_from_logits(logits, row[None, start:], k)[0])
            masked_logits = plain_logits(module, input_ids=ids, attention_mask=mask)
            self.calls.append(
                types.SimpleNamespace(
                    role=role,
                    ids=ids.detach().clone(),
                    k=k,
                    mask=None if mask is None else mask.detach().clone(),
                    output=output,
                    rows=output.logits.shape[1],
                    unpadded=torch.stack(unpadded),
                    masked=logps_from_logits(masked_logits, ids, k),
                    masked_t=logps_from_logits(masked_logits, ids, k, self.temperature),
                )
            )

        return record

    def trl_logps(self, call):
        """The log-probs TRL computed: from the logits it got back (after every hook ran)."""
        return logps_from_logits(call.output.logits.detach(), call.ids, call.k)

    def others_untouched(self) -> bool:
        return all(torch.equal(output.logits, seen) for output, seen in self.others)

    def remove(self):
        for handle in self.handles:
            handle.remove()


def uneven_prompt_dataset(word_counts=(2, 3, 5, 7)):
    """Prompts of different lengths (tiny vocabulary words, never the pad token)."""
    from datasets import Dataset

    import tiny

    words = tiny.vocab_words()
    prompts = [" ".join(words[(i * 37 + j * 11) % len(words)] for j in range(n)) for i, n in enumerate(word_counts)]
    return Dataset.from_dict({"prompt": prompts})
