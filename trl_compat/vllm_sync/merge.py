"""What one layer sends: its own tensors as ``state_dict()`` stores them, or its weight with
the LoRA adapters merged, computed out of place (bit-identical to PEFT's merge)."""

from __future__ import annotations

import copy
import warnings
from typing import Any, Dict, Tuple

# Module attributes holding hook dicts: a private copy of a layer must not carry the
# training model's hooks (DeepSpeed, accelerate) along.
_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def _lora_delta(layer: Any, adapter: str, embedding: bool) -> Any:
    """PEFT's ``get_delta_weight`` arithmetic (identical in 0.8-0.17), into a fresh tensor
    and without PEFT's side effect of re-assigning the adapter weights on CPU half precision."""
    import torch

    if embedding:
        weight_a = layer.lora_embedding_A[adapter].detach()
        weight_b = layer.lora_embedding_B[adapter].detach()
        device, dtype = weight_b.device, weight_a.dtype
        fan_in_fan_out = True
    else:
        weight_a = layer.lora_A[adapter].weight.detach()
        weight_b = layer.lora_B[adapter].weight.detach()
        device, dtype = weight_b.device, weight_b.dtype
        fan_in_fan_out = bool(layer.fan_in_fan_out)
    cast_to_fp32 = device.type == "cpu" and dtype in (torch.float16, torch.bfloat16)
    if cast_to_fp32:
        weight_a, weight_b = weight_a.float(), weight_b.float()
    delta = weight_b @ weight_a
    if fan_in_fan_out:
        delta = delta.T
    delta.mul_(layer.scaling[adapter])  # in place: same bits as PEFT's ``* scaling``
    if cast_to_fp32:
        delta = delta.to(dtype=dtype)
    return delta


def merged_weight(layer: Any, adapters: Tuple[str, ...], embedding: bool) -> Any:
    """``W`` plus each adapter's delta, added in PEFT's order and dtype rules."""
    import torch

    weight = layer.base_layer.weight.detach()
    if not adapters:
        return weight
    with torch.no_grad():
        merged = None
        for adapter in adapters:
            delta = _lora_delta(layer, adapter, embedding)
            if merged is None:
                if (delta.shape == weight.shape and delta.device == weight.device
                        and torch.promote_types(delta.dtype, weight.dtype) == delta.dtype):
                    # PEFT's ``W += delta`` computes W + delta in the promoted dtype and rounds
                    # once to W's dtype; d + W is the same sum, bit for bit, without a copy of W.
                    merged = delta.add_(weight)
                    if merged.dtype != weight.dtype:
                        merged = merged.to(weight.dtype)
                else:
                    merged = weight.clone()
                    merged += delta  # PEFT's ``base_layer.weight.data += delta`` on a copy
            else:
                merged += delta
            del delta
    return merged


def _detached_copy(layer: Any) -> Any:
    """A deep copy of one layer that shares no tensor and no hook with the model."""
    memo: Dict[int, Any] = {}
    for module in layer.modules():
        for attr in _HOOK_DICTS:
            hooks = module.__dict__.get(attr)
            if hooks is not None:
                memo[id(hooks)] = type(hooks)()
        for attr in ("_hf_hook", "_old_forward"):  # accelerate's offload hooks
            if attr in module.__dict__:
                memo[id(module.__dict__[attr])] = None
    return copy.deepcopy(layer, memo)


def copy_merged_state(layer: Any, prefix: str) -> Dict[str, Any]:
    """PEFT's own ``merge()`` on a private copy of the layer; the copy's base state."""
    import torch

    with torch.no_grad():
        shadow = _detached_copy(layer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shadow.merge()
        return shadow.get_base_layer().state_dict(prefix=prefix)


def own_state(module: Any, prefix: str) -> Dict[str, Any]:
    """Exactly what ``state_dict()`` stores for this module's own tensors."""
    out: Dict[str, Any] = {}
    module._save_to_state_dict(out, prefix, False)
    return out
