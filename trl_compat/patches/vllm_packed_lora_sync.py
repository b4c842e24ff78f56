"""vllm-packed-lora-sync: server mode with LoRA, TRL >= 1.11: vLLM receives unmerged (base) weights.

The bug (no upstream issue; TRL PR #6765, "Use vLLM's own server instead of TRL's", 1.11.0, which
moved server mode's weight sync to vLLM's NCCL weight-transfer engine): ``VLLMGeneration.sync_weights``
hands the generator ``_iter_named_params()`` to ``VLLMClient.update_named_params``, which gives it to
vLLM's packed producer (``packed_nccl_broadcast_producer``; before vLLM 0.28
``NCCLWeightTransferEngine.trainer_send_weights(packed=True)``). For a PEFT model the generator
merges the adapter (``model.merge_adapter()``: ``base_layer.weight.data += B @ A * scaling``, in
place), yields ``param.data`` itself for every base weight, and runs ``model.unmerge_adapter()`` (in
place again) when asked for the item after the last. The producer's ``pack_tensors`` keeps the
yielded tensors (views) until its bucket holds 1 GiB or the generator is exhausted, and only then
``torch.cat``s them: the last bucket is read after the unmerge. vLLM gets base weights for every
LoRA-targeted layer of that bucket; a model under 1 GiB is one bucket, so all of them. No error:
server-mode generation samples from the base model (partly, for a large model) for the whole run.
Colocate mode loads each tensor as it comes and is not affected.

Upstream: not reported, not fixed upstream (PR #6765's review raised the same aliasing for ZeRO-3
without PEFT, which does not lose data: tests/patches/test_zero3_packed_sync.py).

Probe: ``VLLMGeneration`` (imported by TRL's GRPO module) without ``_iter_named_params``, or whose
``sync_weights`` does not stream it to ``update_named_params`` (TRL < 1.11): "not needed". With them:
the generator's PEFT branch merges, yields ``param.data`` and unmerges after the yields, and copies
nothing (no ``clone()``/``copy_(``): "needed"; copying: "not needed" (the day TRL fixes it); any other
shape: "undecided".

Fix: in server mode with a PEFT model, ``_iter_named_params`` yields a copy (``clone()``) of each
tensor, taken while the adapter is merged, so a consumer that reads it later still reads the merged
weights. The copies live as long as the producer's bucket (at most one bucket, 1 GiB, which
``torch.cat`` doubles anyway). Other modes and models run TRL's generator unchanged.

Run time: load-bearing: errors propagate. The copy is the fix itself: yielding TRL's views on an
error would send the base weights, unnoticed.

Delete when: a TRL release streams copies of the merged LoRA weights to the server and older releases are no
longer supported (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code, defining_class, normalise

WALK = "_iter_named_params"


def _generation_class(module):
    cls = getattr(module, "VLLMGeneration", None)
    return cls if isinstance(cls, type) else None


def probe(module):
    cls = _generation_class(module)
    if cls is None or defining_class(cls, WALK) is None:
        return not_needed(f"no VLLMGeneration.{WALK}: the weights are not streamed to the server (TRL < 1.11)")
    walk, sync = code(getattr(cls, WALK)), code(cls.sync_weights)
    if "update_named_params(" not in sync or f"{WALK}()" not in sync:
        return not_needed(f"VLLMGeneration.sync_weights does not stream {WALK}() to update_named_params")
    if ".clone()" in walk or "copy_(" in walk:
        return not_needed(f"VLLMGeneration.{WALK} copies the weights it yields")
    merge, unmerge = walk.find(normalise("merge_adapter()")), walk.find(normalise("unmerge_adapter()"))
    peft_yield = walk.find(normalise("yield name, param.data"), merge)
    if merge < 0 or unmerge < 0 or not merge < peft_yield < unmerge:
        return undecided(f"VLLMGeneration.{WALK} is not the merge / yield param.data / unmerge walk this patch knows")
    return needed(
        f"VLLMGeneration.{WALK} yields the merged LoRA weights as views and unmerges them in place after the last "
        "yield; vLLM's packed producer reads its last bucket after that, so the server gets base weights (a model "
        "under 1 GiB: every LoRA-targeted one); the patch yields copies in server mode with a PEFT model"
    )


def _make_walk(original):
    @functools.wraps(original)
    def _iter_named_params(self, *args, **kwargs):
        items = original(self, *args, **kwargs)
        if getattr(self, "mode", None) != "server" or not is_peft_model(getattr(self, "model", None)):
            yield from items
            return
        try:
            for name, tensor in items:
                yield name, tensor.clone()  # read now, while TRL holds the adapter merged
        finally:
            items.close()  # a consumer that stops early: TRL still unmerges and leaves its gather

    return _iter_named_params


def apply(module, patcher):
    patcher.wrap(_generation_class(module), WALK, _make_walk)
