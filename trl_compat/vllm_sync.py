"""One way to push a training model's weights into a colocated vLLM engine.

Used by the ``vllm-lora-names`` (TRL 0.14.0) and ``vllm-merged-weights`` (TRL 0.15.0)
patches instead of TRL's own sync. vLLM receives exactly what ``state_dict()`` of a plain
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
of the training model is written, and the extra memory held at any moment is about one
merged tensor. Under DeepSpeed ZeRO-3 each layer's parameters are gathered for just that
layer (a collective: every rank walks the same layers; only the main process sends).

Layers whose merge arithmetic is not re-done here (DoRA and other LoRA variants,
``lora_bias``, Conv, quantized and non-LoRA tuner layers) are merged by PEFT's own
``merge()`` on a private copy of that one layer. Model structures this module does not know
(FSDP, PEFT auxiliary wrappers other than ``modules_to_save``, prompt-learning PEFT types)
fall back to upstream TRL 0.15.1's in-place merge (PEFT models, with a warning) or to TRL's
own code (anything else).

No torch/peft/deepspeed import at module level: ``import trl_compat`` stays light.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import logging
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from trl_compat._models import peel

log = logging.getLogger("trl_compat")

__all__ = [
    "UnsupportedModel",
    "iter_vllm_weights",
    "push_to_vllm",
    "sync_trainer",
    "vllm_model_of",
]

# Module attributes holding hook dicts: a private copy of a layer must not carry the
# training model's hooks (DeepSpeed, accelerate) along.
_HOOK_DICTS = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called",
    "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs", "_backward_hooks",
    "_backward_pre_hooks", "_state_dict_hooks", "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)

_warned: set = set()


def _warn_once(key: str, msg: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(msg, *args)


class UnsupportedModel(Exception):
    """The model has a structure this module does not know how to stream."""


# -- classes we recognise, looked up without importing anything new --------------------


class _Peft:
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


def _resolve(model: Any, peft: _Peft) -> Tuple[Any, Any]:
    """``(root, peft_model)``: the module whose state_dict names vLLM expects, and the
    PeftModel around it (or ``None``)."""
    model = peel(model, peft=False, fsdp=False)
    if peft.isinstance(model, "PeftModel"):
        tuner = getattr(model, "base_model", None)
        if not peft.isinstance(tuner, "BaseTuner"):
            raise UnsupportedModel(
                f"PEFT type {getattr(model, 'peft_type', '?')} does not inject adapter layers into the model"
            )
        return peel(tuner.model, peft=False, fsdp=False), model
    if peft.isinstance(model, "BaseTuner"):  # a bare LoraModel
        return peel(model.model, peft=False, fsdp=False), None
    return model, None


# -- the plan: which module contributes which tensors, decided before any tensor work ----


@dataclass
class _Step:
    kind: str  # "own": the module's own tensors; "fast": LoRA merged here; "copy": PEFT merges a copy
    prefix: str
    module: Any
    adapters: Tuple[str, ...] = ()


def _adapters_to_merge(layer: Any, keys: Any) -> Tuple[str, ...]:
    """Active adapters PEFT's ``merge()`` would add now: not already merged, present here."""
    active = layer.active_adapters
    if isinstance(active, str):
        active = [active]
    merged = set(getattr(layer, "merged_adapters", ()) or ())
    return tuple(name for name in active if name not in merged and name in keys)


def _fast_kind(layer: Any, peft: _Peft) -> Optional[Tuple[str, ...]]:
    """Adapters to merge if this layer's merge is plain ``W += scaling * B @ A`` that we
    re-compute out of place; ``None`` sends the layer to PEFT's own merge on a copy."""
    import torch

    cls = type(layer)
    if cls is peft.fast_linear and cls is not None:
        keys, base_cls = layer.lora_A.keys(), (torch.nn.Linear,)
        pytorch_utils = sys.modules.get("transformers.pytorch_utils")
        if getattr(pytorch_utils, "Conv1D", None) is not None:  # GPT-2 style, fan_in_fan_out=True
            base_cls += (pytorch_utils.Conv1D,)
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


def _plan(root: Any, peft: _Peft) -> List[_Step]:
    import torch

    steps: List[_Step] = []

    def visit(module: Any, prefix: str) -> None:
        name = type(module).__name__
        if "FullyShardedDataParallel" in name or name.startswith("FSDP"):
            raise UnsupportedModel(f"FSDP-wrapped module at {prefix or '<root>'!r}")
        if peft.isinstance(module, "BaseTunerLayer"):
            adapters = _fast_kind(module, peft)
            if adapters is not None:
                steps.append(_Step("fast", prefix, module, adapters))
            elif callable(getattr(module, "merge", None)):
                steps.append(_Step("copy", prefix, module))
            else:
                raise UnsupportedModel(f"{name} at {prefix!r} is a PEFT layer without merge()")
            return
        if peft.isinstance(module, "ModulesToSaveWrapper"):
            visit(_active_module(module), prefix)
            return
        if peft.isinstance(module, "AuxiliaryTrainingWrapper"):
            raise UnsupportedModel(f"PEFT wrapper {name} at {prefix!r}")
        if module._parameters or module._buffers:
            steps.append(_Step("own", prefix, module))
        for child_name, child in module._modules.items():
            if child is not None:
                visit(child, prefix + child_name + ".")

    if not isinstance(root, torch.nn.Module):
        raise UnsupportedModel(f"not a torch.nn.Module: {type(root).__name__}")
    visit(root, "")
    return steps


# -- computing what a step sends ----------------------------------------------------------


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


def _merged_weight(layer: Any, adapters: Tuple[str, ...], embedding: bool) -> Any:
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


def _copy_merged_state(layer: Any, prefix: str) -> Dict[str, Any]:
    """PEFT's own ``merge()`` on a private copy of the layer; the copy's base state."""
    import torch

    with torch.no_grad():
        shadow = _detached_copy(layer)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            shadow.merge()
        return shadow.get_base_layer().state_dict(prefix=prefix)


def _own_state(module: Any, prefix: str) -> Dict[str, Any]:
    """Exactly what ``state_dict()`` stores for this module's own tensors."""
    out: Dict[str, Any] = {}
    module._save_to_state_dict(out, prefix, False)
    return out


@contextlib.contextmanager
def _gathered(params: List[Any]) -> Iterator[None]:
    """ZeRO-3: make these parameters whole for the duration (read-only; collective)."""
    params = list({id(p): p for p in params if p is not None and hasattr(p, "ds_id")}.values())
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield


def _step_params(step: _Step) -> List[Any]:
    if step.kind == "own":
        return [p for p in step.module._parameters.values() if p is not None]
    return list(step.module.parameters())


class _Plan:
    """Steps in ``state_dict()`` order, plus who owns a merged weight that is also reachable
    under another name (tied embeddings)."""

    def __init__(self, model: Any) -> None:
        self.peft = _Peft()
        self.root, self.peft_model = _resolve(model, self.peft)
        self.steps = _plan(self.root, self.peft)
        self.merged_owner: Dict[int, _Step] = {}
        for step in self.steps:
            if step.kind in ("fast", "copy"):
                weight = step.module.get_base_layer()._parameters.get("weight")
                if weight is not None:
                    self.merged_owner[id(weight)] = step

    def _merged_from(self, owner: _Step) -> Any:
        if owner.kind == "fast":
            return _merged_weight(owner.module, owner.adapters, type(owner.module) is self.peft.fast_embedding)
        return _copy_merged_state(owner.module, "")["weight"]

    def items(self, step: _Step) -> Dict[str, Any]:
        """What this step sends. Call inside ``_gathered(self.params(step))``."""
        if step.kind == "copy":
            return _copy_merged_state(step.module, step.prefix)
        if step.kind == "fast":
            base = step.module.base_layer
            out = _own_state(base, step.prefix)
            out[step.prefix + "weight"] = _merged_weight(
                step.module, step.adapters, type(step.module) is self.peft.fast_embedding
            )
            return out
        out = _own_state(step.module, step.prefix)
        for name, param in step.module._parameters.items():
            owner = self.merged_owner.get(id(param)) if param is not None else None
            if owner is not None and step.prefix + name in out:
                out[step.prefix + name] = self._merged_from(owner)
        return out

    def params(self, step: _Step) -> List[Any]:
        params = _step_params(step)
        if step.kind == "own":
            for param in list(params):
                owner = self.merged_owner.get(id(param))
                if owner is not None:
                    params.extend(_step_params(owner))
        return params


def _stream(plan: _Plan) -> Iterator[Tuple[str, Any]]:
    for step in plan.steps:
        with _gathered(plan.params(step)):
            items = plan.items(step)
            while items:
                # pop so that nothing of ours keeps a merged tensor alive once it is sent
                name = next(iter(items))
                yield name, items.pop(name)
            del items


def iter_vllm_weights(model: Any) -> Iterator[Tuple[str, Any]]:
    """Yield ``(name, tensor)`` for ``model`` as a plain model of its base architecture
    would have them in ``state_dict()``, LoRA adapters merged; one layer at a time.

    ``model`` may be a PeftModel, a plain transformers model, or either wrapped by
    torch.compile / DDP / a DeepSpeed engine. A tensor may share storage with the
    model (never modify it) and, under ZeRO-3, is valid only until the next item is
    requested: consume each before asking for the next, as vLLM's ``load_weights`` does.
    Under ZeRO-3 every rank must run through the whole iterator (the gathers are collective).
    Raises :class:`UnsupportedModel` (before yielding anything) for structures it does not know.
    """
    plan = _Plan(model)  # eager: structure errors surface before the first item
    return _stream(plan)


def _drain(plan: _Plan) -> None:
    """Non-main ranks under ZeRO-3: take part in the same gathers, compute nothing."""
    for step in plan.steps:
        with _gathered(plan.params(step)):
            pass


def push_to_vllm(model: Any, llm_model: Any, *, is_main: bool = True) -> None:
    """Load ``model``'s weights into a vLLM model (``...model_runner.model``) through its
    ``load_weights``. Call on every rank; only ``is_main`` sends (``llm_model`` may be None elsewhere)."""
    _push(_Plan(model), llm_model, is_main)


def _push(plan: _Plan, llm_model: Any, is_main: bool) -> None:
    if not is_main:
        _drain(plan)
        return
    stream = _stream(plan)
    try:
        llm_model.load_weights(stream)
        for _ in stream:  # a receiver that stops early must not leave other ranks in a gather
            pass
    finally:
        stream.close()


# -- fallback: upstream TRL 0.15.1's in-place merge, for structures we do not know --------


def _push_inplace(peft_model: Any, llm_model: Any, is_main: bool) -> None:
    params = list(peft_model.parameters())
    prefix = getattr(peft_model.base_model, "prefix", "lora_")
    active = getattr(peft_model, "active_adapter", "default")
    with _gathered(params):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model.merge_adapter()
        try:
            if is_main:
                state = peft_model.state_dict()
                items = (
                    (k.removeprefix("base_model.model.").replace(".base_layer", "")
                     .replace(f"modules_to_save.{active}.", ""), v)
                    for k, v in state.items()
                    if prefix not in k and "original_module" not in k
                )
                llm_model.load_weights(items)
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peft_model.unmerge_adapter()


# -- the trainer side: what both patches call ---------------------------------------------


def vllm_model_of(trainer: Any) -> Any:
    """The colocated vLLM model TRL 0.14/0.15 load weights into (main process only)."""
    return trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model


def sync_trainer(trainer: Any) -> bool:
    """Push ``trainer.model`` into ``trainer.llm``. Runs on every rank.

    Returns False, having done nothing, when TRL's own code should run instead (a trainer
    or model this module does not recognise)."""
    try:
        model = trainer.model
        is_main = bool(trainer.accelerator.is_main_process)
        llm_model = vllm_model_of(trainer) if is_main else None
    except AttributeError as exc:
        _warn_once("trainer", "trl_compat: vLLM sync: unexpected trainer (%s); using TRL's own weight sync", exc)
        return False
    try:
        plan = _Plan(model)
    except UnsupportedModel as exc:
        peft = _Peft()
        peft_model = peel(model, peft=False, fsdp=False)
        if peft.isinstance(peft_model, "PeftModel") and callable(getattr(peft_model, "merge_adapter", None)):
            _warn_once(
                "inplace:" + str(exc),
                "trl_compat: vLLM sync: %s is not supported by the out-of-place merge; falling back to "
                "TRL 0.15.1's in-place merge_adapter()/unmerge_adapter() (vLLM gets the merged weights, "
                "but the training weights may change by rounding at each sync)", exc,
            )
            _push_inplace(peft_model, llm_model, is_main)
            return True
        _warn_once("unsupported:" + str(exc), "trl_compat: vLLM sync: %s; using TRL's own weight sync", exc)
        return False
    _push(plan, llm_model, is_main)
    return True


# -- wrappers the patches install ----------------------------------------------------------


def make_move_model_to_vllm(original: Callable) -> Callable:
    """Replacement for ``GRPOTrainer._move_model_to_vllm(self)``."""

    @functools.wraps(original)
    def _move_model_to_vllm(self, *args, **kwargs):
        if args or kwargs or not sync_trainer(self):
            return original(self, *args, **kwargs)
        return None

    return _move_model_to_vllm


def make_presync(original: Callable) -> Callable:
    """Wrap the method that holds TRL's inline sync (0.14.0: ``compute_loss``; early
    0.15.0.dev0: ``_prepare_inputs``). It loads only when ``self.state.global_step !=
    self._last_loaded_step``; we sync first and set ``_last_loaded_step``, so TRL's inline
    code (PEFT names, no merge, a whole-model gather) is skipped for that step."""

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        try:
            due = bool(self.args.use_vllm) and self.state.global_step != self._last_loaded_step
        except AttributeError:
            due = False
        if due and sync_trainer(self):
            self._last_loaded_step = self.state.global_step
        return original(self, *args, **kwargs)

    return wrapper
