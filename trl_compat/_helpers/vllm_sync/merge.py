"""What one layer sends: its own tensors as ``state_dict()`` stores them, or its weight with
the LoRA adapters merged, computed out of place (bit-identical to PEFT's merge)."""

from __future__ import annotations

import copy
import warnings
from typing import Any

from trl_compat._helpers.vllm_sync.fold import fold_is_exact

# Module attributes holding hook dicts: a private copy of a layer must not carry the
# training model's hooks (DeepSpeed, accelerate) along.
_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _storage_users() -> Any:
    """``torch._C._storage_Use_Count`` (how many tensors and storage objects share a storage), or
    ``None`` where this torch lacks it: then no buffer is ever reused."""
    import torch

    return getattr(torch._C, "_storage_Use_Count", None)


class Workspace:
    """Output buffers reused from one merged weight to the next within one sync.

    A fresh tensor per layer costs an allocation the size of the weight (on the CPU: fresh pages,
    faulted in and zeroed by the kernel, then given back) and arrives cold in the cache; the
    receiver copies each merged weight at once, so two buffers taking turns are enough. A buffer
    is written again only when no tensor outside this object uses its storage any more (not the
    tensor handed out, not a view of it): a receiver that keeps what it got (``list(stream)``)
    gets fresh tensors, never one overwritten under it."""

    SLOTS = 2  # the tensor being computed, and the one the receiver may still hold while asking

    def __init__(self) -> None:
        self._use_count = _storage_users()
        self._slots: dict[tuple[Any, Any], list[Any]] = {}
        self._alone: dict[int, int] = {}  # id(buffer) -> its use count while nothing else uses it

    def _users(self, flat: Any) -> int:
        return self._use_count(flat.untyped_storage()._cdata)

    def _free(self, flat: Any) -> bool:
        # The count of a buffer nobody else uses is taken when it is made, not assumed: what the
        # question itself adds (the storage object it creates) differs between torch releases.
        return self._users(flat) <= self._alone[id(flat)]

    def empty(self, shape: Any, dtype: Any, device: Any) -> Any:
        """An uninitialised tensor of ``shape``: a reused buffer when one is free, else a fresh one."""
        import torch

        if self._use_count is None:
            return torch.empty(shape, dtype=dtype, device=device)
        numel = 1
        for size in shape:
            numel *= size
        slots = self._slots.setdefault((dtype, device), [])
        free = [i for i, flat in enumerate(slots) if self._free(flat)]
        fits = [i for i in free if slots[i].numel() >= numel]
        if fits:
            return slots[fits[0]][:numel].view(shape)
        flat = torch.empty(numel, dtype=dtype, device=device)
        if free:  # too small: let it go, keep the larger one
            self._alone.pop(id(slots[free[0]]), None)
            slots[free[0]] = flat
            self._alone[id(flat)] = self._users(flat)
        elif len(slots) < self.SLOTS:
            slots.append(flat)
            self._alone[id(flat)] = self._users(flat)
        else:  # the receiver keeps what it got: a tensor of its own, not one we write again
            return flat.view(shape)
        return flat.view(shape)


def _lora_delta(layer: Any, adapter: str, embedding: bool, workspace: Any = None) -> Any:
    """PEFT's ``get_delta_weight`` arithmetic (identical in 0.8-0.17), into a fresh tensor (or a
    ``workspace`` buffer) and without PEFT's side effect of re-assigning the adapter weights on
    CPU half precision."""
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
    scaling = layer.scaling[adapter]
    folded = fold_is_exact(weight_a, weight_b, scaling)
    if folded:  # PEFT scales the weight-sized product; scaling B (out x r) saves that pass, same bits
        weight_b = weight_b * scaling
    if (
        workspace is not None
        and weight_a.dim() == 2
        and weight_b.dim() == 2
        and weight_a.dtype == weight_b.dtype
        and weight_a.device == weight_b.device
    ):
        # the same mm kernel as ``weight_b @ weight_a``, written into a reused buffer
        delta = torch.mm(
            weight_b, weight_a, out=workspace.empty((weight_b.shape[0], weight_a.shape[1]), weight_a.dtype, weight_a.device)
        )
    else:
        delta = weight_b @ weight_a
    if fan_in_fan_out:
        delta = delta.T
    if not folded and (scaling != 1 or workspace is None):  # ``x * 1.0`` is x: skip that pass
        delta.mul_(scaling)  # in place: same bits as PEFT's ``* scaling``
    if cast_to_fp32:
        delta = delta.to(dtype=dtype)
    return delta


def _add_rounded(weight: Any, delta: Any, workspace: Any) -> Any:
    """PEFT's ``W += delta`` for a ``W`` of a narrower float dtype than ``delta`` (bfloat16 base,
    float32 adapters): the sum in ``delta``'s dtype, rounded once to ``W``'s; written into a
    workspace buffer instead of ``W``. ``delta`` is used up."""
    import torch

    out = workspace.empty(weight.shape, weight.dtype, weight.device)
    if weight.device.type != "cpu" or weight.dim() < 2:
        return torch.add(weight, delta, out=out)  # PEFT's own op, its result elsewhere
    # A mixed-dtype add is not vectorised on the CPU (about 3x slower than this). Converting W
    # to delta's wider dtype is exact, so the sum and its rounding are the same, bit for bit.
    rows = max(1, (1 << 18) // max(1, weight[0].numel()))
    scratch = workspace.empty((min(rows, weight.shape[0]),) + tuple(weight.shape[1:]), delta.dtype, delta.device)
    for start in range(0, weight.shape[0], rows):
        part = delta[start : start + rows]
        wide = scratch[: part.shape[0]].copy_(weight[start : start + rows])
        out[start : start + rows].copy_(part.add_(wide))
    return out


def merged_weight(layer: Any, adapters: tuple[str, ...], embedding: bool, workspace: Any = None) -> Any:
    """``W`` plus each adapter's delta, added in PEFT's order and dtype rules. With a
    :class:`Workspace`, the result may live in one of its buffers."""
    import torch

    weight = layer.base_layer.weight.detach()
    if not adapters:
        return weight
    with torch.no_grad():
        merged = None
        for adapter in adapters:
            delta = _lora_delta(layer, adapter, embedding, workspace if merged is None else None)
            if merged is None:
                if (
                    delta.shape == weight.shape
                    and delta.device == weight.device
                    and torch.promote_types(delta.dtype, weight.dtype) == delta.dtype
                ):
                    # PEFT's ``W += delta`` computes W + delta in the promoted dtype and rounds
                    # once to W's dtype; d + W is the same sum, bit for bit, without a copy of W.
                    if delta.dtype == weight.dtype or workspace is None:
                        merged = delta.add_(weight)
                        if merged.dtype != weight.dtype:
                            merged = merged.to(weight.dtype)
                    else:
                        merged = _add_rounded(weight, delta, workspace)
                else:
                    merged = weight.clone()
                    merged += delta  # PEFT's ``base_layer.weight.data += delta`` on a copy
            else:
                merged += delta
            del delta
    return merged


def _detached_copy(layer: Any) -> Any:
    """A deep copy of one layer that shares no tensor and no hook with the model."""
    memo: dict[int, Any] = {}
    for module in layer.modules():
        for attr in _HOOK_DICTS:
            hooks = module.__dict__.get(attr)
            if hooks is not None:
                memo[id(hooks)] = type(hooks)()
        for attr in ("_hf_hook", "_old_forward"):  # accelerate's offload hooks
            if attr in module.__dict__:
                memo[id(module.__dict__[attr])] = None
    return copy.deepcopy(layer, memo)


def copy_merged_state(layer: Any, prefix: str) -> dict[str, Any]:
    """PEFT's own ``merge()`` on a private copy of the layer; the copy's base state."""
    import torch

    with torch.no_grad():
        shadow = _detached_copy(layer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shadow.merge()
        return shadow.get_base_layer().state_dict(prefix=prefix)


def own_state(module: Any, prefix: str) -> dict[str, Any]:
    """Exactly what ``state_dict()`` stores for this module's own tensors."""
    out: dict[str, Any] = {}
    module._save_to_state_dict(out, prefix, False)
    return out
