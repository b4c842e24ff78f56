"""vllm-lora-merge-drift: LoRA + ``use_vllm``: every weight sync drifts the frozen bf16/fp16 base weights.

The bug (TRL issue #6688, open; PR #5188, open, would reload the adapter in server mode instead):
to send vLLM the merged weights, TRL's sync runs ``model.merge_adapter()`` (PEFT:
``base_layer.weight.data += B @ A * scaling``, in place), reads the weights, and runs
``model.unmerge_adapter()`` (``-= B @ A * scaling``, in place again). In the weight's own dtype
``(W + d) - d`` is not ``W``: in bfloat16/float16 the frozen base weights come back rounded, and the
error piles up, one sync per optimizer step (a 256x256 bf16 layer, r=8: max drift 2.4e-4 after one
sync, 1.7e-3 after 100; float32: 3.7e-9). No error: the adapter trains on a base that moves at random,
the reference log-probs (adapter disabled, same base) move with it, and ``save_model`` saves only the
adapter, fitted to a base nobody will load. Not under DeepSpeed ZeRO-3, where the walk's
``GatheredParameters`` (no ``modifier_rank``) throws the in-place changes away on repartition.

Where it shows: every TRL release from 0.15.1 (PR #2725, ``81221661c``, brought the in-place merge in
0.15.0, whose walk ``vllm-merged-weights`` replaces) to 1.16.0. This patch covers the walk of TRL >= 1.11
(PR #6765): ``VLLMGeneration._iter_named_params``, which ``sync_weights`` streams to vLLM in both
colocate and server mode. 0.15.1 - 0.29.x (``GRPOTrainer._move_model_to_vllm`` and its FSDP variants)
and 1.0 - 1.10 (the merge inline in ``VLLMGeneration.sync_weights``) are not patched (the ledger says so).

Probe: ``VLLMGeneration._iter_named_params`` whose PEFT branch calls ``merge_adapter()``, yields
``param.data`` of ``named_parameters()`` under the names this patch rebuilds, and calls
``unmerge_adapter()``: "needed". No ``merge_adapter(`` in the walk (TRL merges out of place or reloads
the adapter): "not needed". No such walk (main-branch 1.11.0.dev0 builds before PR #6765), or any other
shape: "undecided".

Fix: for a PEFT model, outside FSDP and ZeRO-3 (decided at each sync from the generation's
``_dist``), the walk yields the same names in the same order, but each LoRA-adapted weight is
``W + scaling * B @ A`` computed out of place (:class:`trl_compat._helpers.vllm_sync.MergedParameters`:
bit-identical to PEFT's merge, layers it does not re-do merged by PEFT's own ``merge()`` on a private
copy); the live weights are never written. In colocate mode the merged tensors live in two reused
buffers (vLLM's ``load_weights`` copies each at once); in server mode each is a fresh tensor, since vLLM's
packed producer keeps what it gets until its bucket is full. That also makes ``vllm-packed-lora-sync``'s
copies unneeded here: this patch stacks above it and does not call the walk below it; under ZeRO-3,
FSDP, or a model structure the out-of-place merge does not know (with a warning), TRL's walk runs,
with ``vllm-packed-lora-sync`` underneath.

Run time: load-bearing: errors propagate. The out-of-place walk is the fix itself: falling back to
TRL's in-place merge on an error would be the drift, unnoticed.

Delete when: a TRL release no longer merges the LoRA adapter into the live weights for the vLLM sync
(issue #6688) and older releases are no longer supported (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import logging

from trl_compat._engine import needed, not_needed, undecided, warn_once
from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code, defining_class, normalise

log = logging.getLogger(__name__)

WALK = "_iter_named_params"
# TRL's naming of the PEFT branch, which the replacement walk repeats: the probe asks for each
NAMING = (
    "for name, param in model.named_parameters():",
    'name = name.removeprefix("base_model.model.").replace(".base_layer", "")',
    "if model.prefix in name: continue",
    'if "original_module" in name: continue',
    'name = self._fix_param_name_to_vllm(name, extra_prefixes=["modules_to_save.default."])',
)


def _generation_class(module):
    cls = getattr(module, "VLLMGeneration", None)
    return cls if isinstance(cls, type) else None


def probe(module):
    cls = _generation_class(module)
    if cls is None or defining_class(cls, WALK) is None:
        return undecided(
            f"no VLLMGeneration.{WALK}: this release merges the LoRA adapter in place elsewhere in its sync, "
            "which this patch does not cover (it covers TRL >= 1.11's walk)"
        )
    walk = code(getattr(cls, WALK))
    if "merge_adapter(" not in walk:
        return not_needed(f"VLLMGeneration.{WALK} does not merge the adapter into the live weights")
    merge, unmerge = walk.find(normalise("model.merge_adapter()")), walk.find(normalise("model.unmerge_adapter()"))
    peft_yield = walk.find(normalise("yield name, param.data"), merge)
    if merge < 0 or unmerge < 0 or not merge < peft_yield < unmerge or not all(line in walk for line in NAMING):
        return undecided(f"VLLMGeneration.{WALK} is not the merge / yield param.data / unmerge walk this patch knows")
    return needed(
        f"VLLMGeneration.{WALK} merges the LoRA adapter into the live weights and unmerges it in place at every "
        "sync: in bf16/fp16 the frozen base weights drift; the patch yields merged weights computed out of place "
        "(outside ZeRO-3, where the gather discards the changes)"
    )


def _out_of_place(generation) -> bool:
    """Whether this sync writes the live weights in TRL's walk and the out-of-place one can replace it."""
    dist = getattr(generation, "_dist", None)
    if dist is None or not is_peft_model(getattr(generation, "model", None)):
        return False
    return not (getattr(dist, "is_zero3", True) or getattr(dist, "is_fsdp", True))


def _walk(generation, merged, fresh):
    """TRL's PEFT branch (names, order, filters), merged weights computed out of place."""
    from trl_compat._helpers.vllm_sync import Workspace

    model = generation.model
    workspace = None if fresh else Workspace()
    for name, param in model.named_parameters():
        name = name.removeprefix("base_model.model.").replace(".base_layer", "")
        if model.prefix in name:
            continue
        if "original_module" in name:
            continue
        name = generation._fix_param_name_to_vllm(name, extra_prefixes=["modules_to_save.default."])
        value = merged.value(param, workspace)
        yield name, (param.data if value is None else value)


def _make_walk(original):
    @functools.wraps(original)
    def _iter_named_params(self, *args, **kwargs):
        if args or kwargs or not _out_of_place(self):
            return original(self, *args, **kwargs)
        from trl_compat._helpers.vllm_sync import MergedParameters, UnsupportedModel

        try:
            merged = MergedParameters(self.model)
        except UnsupportedModel as exc:
            warn_once(
                log,
                "unsupported:" + str(exc),
                "trl_compat: vllm-lora-merge-drift: %s; using TRL's in-place merge_adapter()/unmerge_adapter() "
                "(the base weights may drift by rounding at each sync)",
                exc,
            )
            return original(self, *args, **kwargs)
        # server mode: vLLM's packed producer keeps the tensors until its bucket is full
        return _walk(self, merged, fresh=getattr(self, "mode", None) != "colocate")

    return _iter_named_params


def apply(module, patcher):
    patcher.wrap(_generation_class(module), WALK, _make_walk)
