"""The watched matrices of W1/W2 (see :mod:`.weights`): which ones, their sampled elements and
snapshots, how a sent name maps to vLLM's, and the trainer's expected value of each (the oracle,
with LoRA merged here at the sampled elements)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from trl_compat._helpers.models import peel
from trl_compat.guard._engines import EngineRecord, Finding, Watch, Weights
from trl_compat.guard._ledger import LEDGER

WATCHED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
MOVED = 0.01  # (i): the adapter moves at least this fraction of the sampled elements
CORRUPT = 0.01  # (ii): more than this fraction off the merge
ULPS = 4.0
_PREFIXES = ("base_model.model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module.")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass
class Expected:
    """The trainer's value of a watched matrix at its sampled elements (float64)."""

    value: Any
    base: Any | None = None  # LoRA: the base weight W (``value`` is W + s·B@A)
    bound: Any | None = None  # LoRA: a rounding bound of the merge per element
    local: bool = False  # only this rank's shard (a DTensor): tells a change, not the values
    merged_in_place: bool = False  # PEFT merged the adapter into ``base_layer`` itself


def _layer_number(name: str) -> int:
    found = _LAYER.search("." + name)
    return int(found.group(1)) if found else -1


def engine_built(engine: EngineRecord) -> None:
    """Choose the watched matrices of a new engine and snapshot them (its checkpoint)."""
    model = engine.model
    state = engine.weights = Weights()
    if model is None or not hasattr(model, "named_parameters"):
        LEDGER.warn_once("W-no-model", "checks W1/W2 unavailable: vLLM's model is not in this process")
        return
    candidates: dict[str, list[tuple[str, Any]]] = {}
    for name, param in model.named_parameters():
        if param.dim() == 2 and name.endswith(WATCHED) and _layer_number(name) >= 0:
            candidates.setdefault(name.split(".layers.")[-1].split(".", 1)[1], []).append((name, param))
    for group in candidates.values():
        group.sort(key=lambda item: _layer_number(item[0]))
        for name, param in {group[0][0]: group[0][1], group[-1][0]: group[-1][1]}.items():
            state.watches[name] = Watch(name, param)
            state.params[name] = param
    if not state.watches:
        LEDGER.warn_once("W-none", "checks W1/W2 unavailable: vLLM's model has no o_proj/down_proj matrix to watch")


def vllm_name(sent: str) -> str:
    """A sent name as vLLM names it: PEFT's and the wrappers' prefixes, and ``.base_layer``, dropped."""
    changed = True
    while changed:
        changed = False
        for prefix in _PREFIXES:
            if sent.startswith(prefix):
                sent, changed = sent[len(prefix) :], True
    return sent.replace(".base_layer.", ".")


def _module_of(trainer: Any, name: str) -> Any:
    model = getattr(trainer, "model", None)
    if model is None:
        return None
    base = peel(model)
    try:
        return base.get_submodule(name.rsplit(".", 1)[0])
    except (AttributeError, TypeError):
        return None


def expected(trainer: Any, watch: Watch) -> Expected | None:
    """The trainer's value of a watched matrix at its sampled elements, float64 (None: unknown).

    Computed here, not with ``_helpers.vllm_sync.merge``: an oracle must not reuse the code it checks."""
    import torch

    module = _module_of(trainer, watch.name)
    if module is None:
        return None
    lora_a, lora_b = getattr(module, "lora_A", None), getattr(module, "lora_B", None)
    base_layer = getattr(module, "base_layer", None)
    weight = getattr(base_layer if base_layer is not None else module, "weight", None)
    if weight is None:
        return None
    if type(weight).__name__ == "DTensor" or type(getattr(weight, "data", None)).__name__ == "DTensor":
        local = weight.to_local().detach().reshape(-1)
        if local.numel() == 0:
            return None
        return Expected(local[watch.index.to(local.device) % local.numel()].to("cpu", torch.float64), local=True)
    if tuple(weight.shape) != watch.shape:
        return None  # gathered elsewhere (ZeRO-3), or not the same matrix
    with torch.no_grad():
        index = watch.index.to(weight.device)
        value = weight.detach().reshape(-1)[index].to("cpu", torch.float64)
        if lora_a is None or lora_b is None or base_layer is None:
            return Expected(value)
        if getattr(module, "fan_in_fan_out", False) or getattr(module, "disable_adapters", False):
            return None
        active = getattr(module, "active_adapters", None) or []
        active = [active] if isinstance(active, str) else list(active)
        rows, cols = (watch.index // watch.shape[1]), (watch.index % watch.shape[1])
        delta = torch.zeros(len(watch.index), dtype=torch.float64)
        bound = torch.zeros(len(watch.index), dtype=torch.float64)
        for adapter in active:
            if adapter not in lora_a or adapter not in lora_b:
                continue
            a = lora_a[adapter].weight.detach().to("cpu", torch.float64)  # r x in
            b = lora_b[adapter].weight.detach().to("cpu", torch.float64)  # out x r
            scaling = float(module.scaling[adapter])
            terms = b[rows] * a[:, cols].T * scaling
            delta += terms.sum(dim=1)
            bound += terms.abs().sum(dim=1)
        merged_in_place = bool(getattr(module, "merged", False))
        base = value - delta if merged_in_place else value
        merged = value if merged_in_place else value + delta
        return Expected(merged, base=base, bound=bound + base.abs(), merged_in_place=merged_in_place)


def _ulp(dtype: Any) -> float:
    import torch

    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def compare_sent(watch: Watch, sent: Any, dtype: Any, wanted: Expected) -> Finding | None:
    """W1 (c)/(d) on one sent matrix: None if it is what the trainer holds."""
    value = wanted.value
    if wanted.base is None or wanted.bound is None:  # a plain parameter: exactly what the trainer holds, in the sent dtype
        differ = sent != value.to(dtype).to(sent.dtype)
        if not bool(differ.any()):
            return None
        return Finding(watch.name, "differs", float(differ.double().mean()), float((sent - value).abs().max()))
    base, bound = wanted.base, wanted.bound
    moved = value.to(dtype) != base.to(dtype)
    if not wanted.merged_in_place and bool((sent == base.to(dtype).to(sent.dtype)).all()) and float(moved.double().mean()) >= MOVED:
        return Finding(watch.name, "unmerged", float(moved.double().mean()), float((sent - value).abs().max()))
    off = (sent - value).abs() > ULPS * _ulp(dtype) * bound + 1e-30
    if float(off.double().mean()) > CORRUPT:
        return Finding(watch.name, "corrupted", float(off.double().mean()), float((sent - value).abs().max()))
    return None
