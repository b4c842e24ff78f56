"""One way to push a training model's weights into a colocated vLLM engine.

Used by the ``vllm-lora-names`` (TRL 0.14.0) and ``vllm-merged-weights`` (TRL 0.15.0)
patches instead of TRL's own sync (``vllm-lora-merge-drift``, TRL >= 1.11, keeps TRL's walk and
takes only the merged values: ``params``). vLLM receives exactly what ``state_dict()`` of a plain
model of the base architecture would hold, the adapter merged in:

* base names: no ``base_model.model.`` prefix, no ``.base_layer``, no ``_orig_mod.`` /
  ``module.`` from torch.compile / DDP / DeepSpeed wrappers;
* no LoRA parameters, and of a ``modules_to_save`` module only the copy the model uses now;
* for each LoRA layer the merged weight ``W + scaling * B @ A`` (``fan_in_fan_out``
  respected, dropout plays no part, several adapters in the order PEFT merges them, adapters
  that are already merged not added twice), bit-identical to what PEFT's own
  ``merge_and_unload()`` would give.

Unlike TRL (0.15.1 and later merge/unmerge the live weights, which is not bit-exact), the
merged tensors are computed out of place, one layer at a time, as a generator: no parameter
of the training model is written, and the extra memory held at any moment is about two
merged tensors (two buffers reused in turn, each written again only once nothing outside the
sync uses it; the buffers live as long as the stream). Under DeepSpeed ZeRO-3 each layer's parameters are gathered for just that
layer (a collective: every rank walks the same layers; only the main process sends).

Layers whose merge arithmetic is not re-done here (DoRA and other LoRA variants,
``lora_bias``, Conv, quantized and non-LoRA tuner layers) are merged by PEFT's own
``merge()`` on a private copy of that one layer. Model structures this module does not know
(FSDP, PEFT auxiliary wrappers other than ``modules_to_save``, prompt-learning PEFT types)
fall back to upstream TRL 0.15.1's in-place merge (PEFT models, with a warning) or to TRL's
own code (anything else).

Modules: ``structure`` (which module sends what: the plan), ``merge`` (the merged tensors),
``fold`` (when ``merge`` may scale B instead of ``B @ A``: the same bits), ``stream`` (the plan
walked into ``load_weights``, gathered under ZeRO-3 through :mod:`trl_compat._helpers.zero3`; the
in-place fallback), ``params`` (the merged value of each parameter, for a walk that keeps TRL's own
names: ``vllm-lora-merge-drift``), ``trainer`` (what the patches install).
No torch/peft/deepspeed import at module level: ``import trl_compat`` stays light.
"""

from __future__ import annotations

from trl_compat._helpers.vllm_sync.merge import Workspace
from trl_compat._helpers.vllm_sync.params import MergedParameters
from trl_compat._helpers.vllm_sync.stream import iter_vllm_weights, push_to_vllm
from trl_compat._helpers.vllm_sync.structure import UnsupportedModel
from trl_compat._helpers.vllm_sync.trainer import make_move_model_to_vllm, make_presync, sync_trainer, vllm_model_of

__all__ = [
    "MergedParameters",
    "UnsupportedModel",
    "Workspace",
    "iter_vllm_weights",
    "make_move_model_to_vllm",
    "make_presync",
    "push_to_vllm",
    "sync_trainer",
    "vllm_model_of",
]
