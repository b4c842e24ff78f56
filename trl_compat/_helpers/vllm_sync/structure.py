"""Which module of a training model contributes which tensors to vLLM: the plan, decided
before any tensor work, from the model's structure alone."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from trl_compat._helpers.models import peel


class UnsupportedModel(Exception):
    """The model has a structure this module does not know how to stream."""


# -- classes we recognise, looked up without importing anything new --------------------


class Peft:
    """PEFT's classes, or ``None`` each where PEFT (or that class) is not loaded."""

    def __init__(self) -> None:
        self.PeftModel = self.BaseTuner = self.BaseTunerLayer = None
        self.ModulesToSaveWrapper = self.AuxiliaryTrainingWrapper = None
        self.fast_linear = self.fast_embedding = None
        if "peft" not in sys.modules:  # a model can't hold PEFT objects if PEFT isn't imported
            return
        import peft

        self.PeftModel = getattr(peft, "PeftModel", None)
        tuners_utils = sys.modules.get("peft.tuners.tuners_utils")
        if tuners_utils is not None:
            self.BaseTuner = getattr(tuners_utils, "BaseTuner", None)
            self.BaseTunerLayer = getattr(tuners_utils, "BaseTunerLayer", None)
        other = sys.modules.get("peft.utils.other")
        if other is not None:
            self.ModulesToSaveWrapper = getattr(other, "ModulesToSaveWrapper", None)
            self.AuxiliaryTrainingWrapper = getattr(other, "AuxiliaryTrainingWrapper", None)
        lora_layer = sys.modules.get("peft.tuners.lora.layer")
        if lora_layer is not None:
            self.fast_linear = getattr(lora_layer, "Linear", None)
            self.fast_embedding = getattr(lora_layer, "Embedding", None)

    def isinstance(self, obj: Any, name: str) -> bool:
        cls = getattr(self, name)
        return cls is not None and isinstance(obj, cls)


def resolve(model: Any, peft: Peft) -> tuple[Any, Any]:
    """``(root, peft_model)``: the module whose state_dict names vLLM expects, and the
    PeftModel around it (or ``None``)."""
    model = peel(model, peft=False, fsdp=False)
    if peft.isinstance(model, "PeftModel"):
        tuner = getattr(model, "base_model", None)
        if tuner is None or not peft.isinstance(tuner, "BaseTuner"):
            raise UnsupportedModel(f"PEFT type {getattr(model, 'peft_type', '?')} does not inject adapter layers into the model")
        return peel(tuner.model, peft=False, fsdp=False), model
    if peft.isinstance(model, "BaseTuner"):  # a bare LoraModel
        return peel(model.model, peft=False, fsdp=False), None
    return model, None


# -- the plan: which module contributes which tensors, decided before any tensor work ----


@dataclass
class Step:
    kind: str  # "own": the module's own tensors; "fast": LoRA merged here; "copy": PEFT merges a copy
    prefix: str
    module: Any
    adapters: tuple[str, ...] = ()


def _adapters_to_merge(layer: Any, keys: Any) -> tuple[str, ...]:
    """Active adapters PEFT's ``merge()`` would add now: not already merged, present here."""
    active = layer.active_adapters
    if isinstance(active, str):
        active = [active]
    merged = set(getattr(layer, "merged_adapters", ()) or ())
    return tuple(name for name in active if name not in merged and name in keys)


def _fast_kind(layer: Any, peft: Peft) -> tuple[str, ...] | None:
    """Adapters to merge if this layer's merge is plain ``W += scaling * B @ A`` that we
    re-compute out of place; ``None`` sends the layer to PEFT's own merge on a copy."""
    import torch

    cls = type(layer)
    base_cls: tuple[Any, ...]  # torch classes (Any to mypy, so isinstance keeps `base` as the module it is)
    if cls is peft.fast_linear and cls is not None:
        keys, base_cls = layer.lora_A.keys(), (torch.nn.Linear,)
        conv1d = getattr(sys.modules.get("transformers.pytorch_utils"), "Conv1D", None)
        if conv1d is not None:  # GPT-2 style, fan_in_fan_out=True
            base_cls += (conv1d,)
    elif cls is peft.fast_embedding and cls is not None:
        keys, base_cls = layer.lora_embedding_A.keys(), (torch.nn.Embedding,)
    else:
        return None
    base = layer.__dict__["_modules"].get("base_layer")
    if not isinstance(base, base_cls) or peft.isinstance(base, "BaseTunerLayer") or base._modules:
        return None
    if type(base)._save_to_state_dict is not torch.nn.Module._save_to_state_dict:
        return None
    weight = base._parameters.get("weight")
    if weight is None or not weight.is_floating_point():
        return None
    adapters = _adapters_to_merge(layer, keys)
    for name in adapters:
        if cls is peft.fast_embedding and layer.lora_embedding_A[name].dtype != weight.dtype:
            return None  # PEFT 0.17 rounds the delta to W's dtype before adding, 0.14/0.15 do not
        if (getattr(layer, "use_dora", {}) or {}).get(name, False):
            return None
        if name in (getattr(layer, "lora_variant", {}) or {}):
            return None
        if (getattr(layer, "lora_bias", {}) or {}).get(name, False):
            return None  # PEFT changed how lora_bias merges (0.14: +B.bias; 0.17: +B.bias*scaling)
        if not isinstance(layer.scaling.get(name), (int, float)):
            return None
    return adapters


def _active_module(wrapper: Any) -> Any:
    """The module a ``ModulesToSaveWrapper`` forwards to right now."""
    if wrapper.disable_adapters:
        return wrapper.original_module
    active = getattr(wrapper, "active_adapters", None)
    if active is None:
        active = [wrapper.active_adapter]
    elif isinstance(active, str):
        active = [active]
    if active and active[0] in wrapper.modules_to_save:
        return wrapper.modules_to_save[active[0]]
    return wrapper.original_module


def plan_steps(root: Any, peft: Peft) -> list[Step]:
    import torch

    steps: list[Step] = []

    def visit(module: Any, prefix: str) -> None:
        name = type(module).__name__
        if "FullyShardedDataParallel" in name or name.startswith("FSDP"):
            raise UnsupportedModel(f"FSDP-wrapped module at {prefix or '<root>'!r}")
        if peft.isinstance(module, "BaseTunerLayer"):
            adapters = _fast_kind(module, peft)
            if adapters is not None:
                steps.append(Step("fast", prefix, module, adapters))
            elif callable(getattr(module, "merge", None)):
                steps.append(Step("copy", prefix, module))
            else:
                raise UnsupportedModel(f"{name} at {prefix!r} is a PEFT layer without merge()")
            return
        if peft.isinstance(module, "ModulesToSaveWrapper"):
            visit(_active_module(module), prefix)
            return
        if peft.isinstance(module, "AuxiliaryTrainingWrapper"):
            raise UnsupportedModel(f"PEFT wrapper {name} at {prefix!r}")
        if module._parameters or module._buffers:
            steps.append(Step("own", prefix, module))
        for child_name, child in module._modules.items():
            if child is not None:
                visit(child, prefix + child_name + ".")

    if not isinstance(root, torch.nn.Module):
        raise UnsupportedModel(f"not a torch.nn.Module: {type(root).__name__}")
    visit(root, "")
    return steps
