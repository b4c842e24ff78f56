"""Per parameter, what PEFT's ``merge_adapter()`` would make of it, computed out of place: for a
walk that keeps its own names and order (``named_parameters()``, as TRL >= 1.11's
``VLLMGeneration._iter_named_params`` does) but must not write the live weights."""

from __future__ import annotations

from typing import Any

from trl_compat._helpers.vllm_sync.merge import copy_merged_state, merged_weight
from trl_compat._helpers.vllm_sync.stream import Plan


class MergedParameters:
    """``value(param)``: the merged tensor for a parameter that PEFT's merge writes (a LoRA
    layer's base weight, or any base parameter of a layer merged by PEFT's own ``merge()`` on a
    private copy), ``None`` for every other parameter (the caller sends it as it is).

    Built from the model's structure (:class:`~trl_compat._helpers.vllm_sync.stream.Plan`): raises
    :class:`~trl_compat._helpers.vllm_sync.structure.UnsupportedModel` for a structure it does not
    know, before any tensor work. No parameter of the model is written. A merged tensor lives in
    ``workspace`` (a :class:`~trl_compat._helpers.vllm_sync.merge.Workspace`) when one is given,
    else it is a fresh tensor of its own (for a consumer that keeps what it gets)."""

    def __init__(self, model: Any) -> None:
        plan = Plan(model)
        self._embedding = plan.peft.fast_embedding
        self._owner: dict[int, tuple[Any, str]] = {}
        self._copies: dict[int, dict[str, Any]] = {}
        for step in plan.steps:
            if step.kind == "fast":
                weight = step.module.base_layer._parameters.get("weight")
                if weight is not None and step.adapters:
                    self._owner[id(weight)] = (step, "weight")
            elif step.kind == "copy":
                for key, param in step.module.get_base_layer().named_parameters():
                    self._owner.setdefault(id(param), (step, key))

    def value(self, param: Any, workspace: Any = None) -> Any:
        hit = self._owner.get(id(param))
        if hit is None:
            return None
        step, key = hit
        if step.kind == "fast":
            return merged_weight(step.module, step.adapters, type(step.module) is self._embedding, workspace)
        state = self._copies.get(id(step))
        if state is None:  # PEFT's own merge() on a copy of the layer, once for all its parameters
            state = self._copies[id(step)] = copy_merged_state(step.module, "")
        value = state.pop(key, None)
        if not state:
            del self._copies[id(step)]
        return value
