"""One way to reach the model under the wrappers training puts around it.

Training wraps the user's model in torch.compile's ``OptimizedModule`` (``_orig_mod``), DDP /
DataParallel / a DeepSpeed engine / FSDP1 (``module``) and PEFT (``PeftModel`` ->
``base_model`` tuner -> ``model``). Patches that change or read the real model peel these off
here. Classes are recognised by name along the MRO, so neither torch, deepspeed nor peft is
imported, and subclasses are peeled like their bases.
"""

from __future__ import annotations

from typing import Any

_DISTRIBUTED = frozenset({"DistributedDataParallel", "DataParallel", "DeepSpeedEngine", "PipelineEngine"})
_FSDP1 = frozenset({"FullyShardedDataParallel"})


def _class_names(obj: Any) -> frozenset:
    return frozenset(c.__name__ for c in type(obj).__mro__)


def is_peft_model(model: Any) -> bool:
    """A PEFT ``PeftModel`` (or a subclass), known by class name: peft is not imported."""
    return "PeftModel" in _class_names(model)


def peel(model: Any, *, peft: bool = True, fsdp: bool = True) -> Any:
    """``model`` without its compile/DDP/DeepSpeed wrappers, and without PEFT (``peft=True``)
    and FSDP1 (``fsdp=True``) ones. Callers that must see the PeftModel itself (to merge
    adapters) or the FSDP module (to gather its shards) turn those off."""
    containers = _DISTRIBUTED | _FSDP1 if fsdp else _DISTRIBUTED
    for _ in range(32):
        orig = getattr(model, "_orig_mod", None)
        if orig is not None and orig is not model:
            model = orig
            continue
        names = _class_names(model)
        if names & containers:
            inner = getattr(model, "module", None)
            if inner is not None and inner is not model:
                model = inner
                continue
        if peft and "PeftModel" in names and callable(getattr(model, "get_base_model", None)):
            model = model.get_base_model()
            continue
        if peft and "BaseTuner" in names and getattr(model, "model", None) is not None:  # a bare LoraModel
            model = model.model
            continue
        break
    return model
