"""Checks W1 (what each weight sync sent) and W2 (the weights vLLM holds at ``generate``).

Both look at a few *watched* matrices: the ``o_proj`` and ``down_proj`` weights of the first and
last decoder layers, whose vLLM name and shape are the Hugging Face ones (no packing), at K fixed
flat indices each (``SAMPLE``). Norm weights barely move in a step and frozen ones never do
(research §4.3), so matrices, not norms; sampled elements, not norms of tensors, so that rounding
cannot hide a change and nothing has to be summed.

W1, at each sync (the engine model's ``load_weights``; TRL 0.14/0.15 call it once with the whole
state dict, 0.18+ once per parameter: the calls between two ``generate`` calls are one sync):

* (a) something was sent: a sync that sends nothing, or no sync at all before a ``generate`` at a
  later optimizer step although the trainer's watched weights changed (FSDP2 in TRL 0.18/0.19,
  ``fsdp2-vllm-sync``);
* (b) each watched matrix the trainer changed since the last sync was sent;
* (c)/(d) what was sent equals the trainer's weights at the moment it was sent: exactly for a
  plain parameter (cast to the sent dtype); under LoRA the merged weight ``W + s·B@A`` computed
  here (at the sampled elements, in float64, from ``base_layer``, ``lora_A``/``lora_B`` and
  ``scaling``): (i) the sent elements equal the base ``W`` exactly although ``s·B@A`` moves at
  least 1% of them: the adapter was not merged (TRL 0.15.0, ``vllm-merged-weights``); (ii) more
  than 1% differ from the merge by more than a few units in the last place: corrupted.

W2, at each ``generate`` of an in-process engine: the watched elements as vLLM holds them
(``engine.model``) against the last sync, as sent and cast to vLLM's dtype. A matrix is
calibrated at the first sync that sends it: it is verifiable only if vLLM then holds exactly what
was sent (vLLM may store a tensor transformed: quantised, repacked, padded); nothing verifiable ->
"unavailable", never "mismatch". A mismatch is classified against the engine's own snapshot taken
when it was built (the checkpoint) and the sync before the last: "vLLM holds the initial/on-disk
weights", "one sync behind", or corrupted.

A rule that cannot be decided (a tensor sharded as a DTensor or gathered elsewhere, LoRA on a
``fan_in_fan_out`` layer, no trainer found) says nothing. vLLM's own ``reload_weights`` (a
``collective_rpc``) also goes through ``load_weights``: it is no sync, and the core does not pass
it here (a ``load_weights`` inside an engine call).
"""

from __future__ import annotations

import logging
import re
import zlib
from typing import Any, Dict, List, Optional, Tuple

from trl_compat._engine import guarded
from trl_compat._helpers.models import peel
from trl_compat.guard import _trainers
from trl_compat.guard._alarms import LEDGER, Alarm

log = logging.getLogger("trl_compat.guard")
GUARD_ID = "offpolicy-guard"
SAMPLE = 4096  # elements per watched matrix
WATCHED = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
MOVED = 0.01  # (i): the adapter moves at least this fraction of the sampled elements
CORRUPT = 0.01  # (ii): more than this fraction off the merge
ULPS = 4.0
_PREFIXES = ("base_model.model.", "_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.", "module.")
_LAYER = re.compile(r"\.layers\.(\d+)\.")


class Watch:
    """One watched matrix: its sampled indices and snapshots (vLLM's dtype, 1-D, CPU)."""

    def __init__(self, name: str, param: Any) -> None:
        import torch

        self.name = name
        numel = param.numel()
        generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # the same on every rank
        self.index = torch.randperm(numel, generator=generator)[:SAMPLE].sort().values if numel > SAMPLE else torch.arange(numel)
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.checkpoint = self.engine_values(param)  # what the engine holds when built
        self.verified: Optional[bool] = None  # None: not sent yet; False: vLLM stores it transformed
        self.last: Optional[Any] = None  # the last sync's sent elements, in vLLM's dtype
        self.previous: Optional[Any] = None
        self.sent: Optional[Any] = None  # sent in the open sync, not yet loaded
        self.trainer_last: Optional[Any] = None  # the trainer's expected elements at the last sync (or first generate)

    def engine_values(self, param: Any) -> Any:
        return param.detach().reshape(-1)[self.index.to(param.device)].to("cpu").clone()


class Weights:
    """W1/W2's state for one in-process engine."""

    def __init__(self) -> None:
        self.watches: Dict[str, Watch] = {}
        self.params: Dict[str, Any] = {}  # watched name -> vLLM's parameter
        self.open: Optional[dict] = None  # the sync being sent: step, count, names, findings
        self.generated_at: Optional[int] = None  # the step of the last generate
        self.synced_since_generate = False


def _layer_number(name: str) -> int:
    found = _LAYER.search("." + name)
    return int(found.group(1)) if found else -1


def engine_built(engine: Any) -> None:
    """Choose the watched matrices of a new engine and snapshot them (its checkpoint)."""
    model = getattr(engine, "model", None)
    engine.weights = Weights()
    if model is None or not hasattr(model, "named_parameters"):
        LEDGER.warn_once("W-no-model", "checks W1/W2 unavailable: vLLM's model is not in this process")
        return
    candidates: Dict[str, List[Tuple[str, Any]]] = {}
    for name, param in model.named_parameters():
        if param.dim() == 2 and name.endswith(WATCHED) and _layer_number(name) >= 0:
            candidates.setdefault(name.split(".layers.")[-1].split(".", 1)[1], []).append((name, param))
    for group in candidates.values():
        group.sort(key=lambda item: _layer_number(item[0]))
        for name, param in {group[0][0]: group[0][1], group[-1][0]: group[-1][1]}.items():
            engine.weights.watches[name] = Watch(name, param)
            engine.weights.params[name] = param
    if not engine.weights.watches:
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


# -- the trainer's side --------------------------------------------------------------------------------


def _trainer(engine: Any) -> Any:
    """The trainer syncing into ``engine``: the one that generated with it last (the core keeps it),
    else the one on the stack."""
    ref = getattr(engine, "trainer", None)
    trainer = ref() if ref is not None else None
    return trainer if trainer is not None else _trainers.calling_trainer()


def _module_of(trainer: Any, name: str) -> Any:
    model = getattr(trainer, "model", None)
    if model is None:
        return None
    base = peel(model)
    try:
        return base.get_submodule(name.rsplit(".", 1)[0])
    except (AttributeError, TypeError):
        return None


def expected(trainer: Any, watch: Watch) -> Optional[dict]:
    """The trainer's value of a watched matrix at its sampled elements, float64: ``{"value"}`` for a
    plain parameter, plus ``"base"`` and ``"bound"`` (a rounding bound) under LoRA; ``"local"``:
    only this rank's shard (a DTensor), good for telling a change, not for comparing. None: unknown."""
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
        return {"value": local[watch.index.to(local.device) % local.numel()].to("cpu", torch.float64), "local": True}
    if tuple(weight.shape) != watch.shape:
        return None  # gathered elsewhere (ZeRO-3), or not the same matrix
    with torch.no_grad():
        index = watch.index.to(weight.device)
        value = weight.detach().reshape(-1)[index].to("cpu", torch.float64)
        if lora_a is None or lora_b is None or base_layer is None:
            return {"value": value, "local": False}
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
        return {"value": merged, "base": base, "bound": bound + base.abs(), "local": False, "merged_in_place": merged_in_place}


# -- W1: the sync ------------------------------------------------------------------------------------------


def audit_sync(engine: Any, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """Called with ``load_weights``' arguments before vLLM sees them; returns them, the iterable
    wrapped so that each (name, tensor) is recorded as vLLM takes it."""
    state: Optional[Weights] = getattr(engine, "weights", None)
    if state is None:
        return args, kwargs
    trainer = _trainer(engine)
    step = _trainers.global_step(trainer)
    if state.open is not None and state.open["step"] != step:
        _close(engine, state)
    if state.open is None:
        state.open = {"step": step, "count": 0, "names": set(), "trainer": trainer, "findings": []}
    sync = state.open
    if "weights" in kwargs:
        kwargs = dict(kwargs, weights=_recording(engine, state, sync, kwargs["weights"]))
    elif args:
        args = (_recording(engine, state, sync, args[0]),) + tuple(args[1:])
    return args, kwargs


def _recording(engine: Any, state: Weights, sync: dict, weights: Any) -> Any:
    for item in weights:
        # the item goes on unchanged whatever happens here (errors re-raised only under TRL_COMPAT_STRICT)
        with guarded(GUARD_ID, "recording a sent tensor", fallback="this tensor is not audited", logger=log):
            if isinstance(item, tuple) and len(item) == 2:
                _record_one(state, sync, item[0], item[1])
        yield item


def _record_one(state: Weights, sync: dict, name: str, tensor: Any) -> None:
    import torch

    sync["count"] += 1
    key = vllm_name(str(name))
    sync["names"].add(key)
    watch = state.watches.get(key)
    if watch is None or not hasattr(tensor, "reshape") or tuple(tensor.shape) != watch.shape:
        return
    with torch.no_grad():
        sent = tensor.detach().reshape(-1)[watch.index.to(tensor.device)].to("cpu")
    watch.sent = sent.to(watch.dtype)
    trainer = sync["trainer"]
    wanted = expected(trainer, watch) if trainer is not None else None
    if wanted is None:
        return
    watch.trainer_last = wanted["value"]
    if wanted["local"]:
        return  # a shard (FSDP2): it tells a change, not the whole tensor's values
    finding = _compare_sent(watch, sent.to(torch.float64), sent.dtype, wanted)
    if finding is not None:
        sync["findings"].append(finding)


def _ulp(dtype: Any) -> float:
    import torch

    return float(torch.finfo(dtype).eps) if dtype.is_floating_point else 0.0


def _compare_sent(watch: Watch, sent: Any, dtype: Any, wanted: dict) -> Optional[dict]:
    value = wanted["value"]
    if "base" not in wanted:  # a plain parameter: exactly what the trainer holds, in the sent dtype
        differ = sent != value.to(dtype).to(sent.dtype)
        if not bool(differ.any()):
            return None
        return {"name": watch.name, "kind": "differs", "frac": float(differ.double().mean()), "max": float((sent - value).abs().max())}
    base, bound = wanted["base"], wanted["bound"]
    moved = value.to(dtype) != base.to(dtype)
    if (
        not wanted.get("merged_in_place")
        and bool((sent == base.to(dtype).to(sent.dtype)).all())
        and float(moved.double().mean()) >= MOVED
    ):
        return {"name": watch.name, "kind": "unmerged", "frac": float(moved.double().mean()), "max": float((sent - value).abs().max())}
    off = (sent - value).abs() > ULPS * _ulp(dtype) * bound + 1e-30
    if float(off.double().mean()) > CORRUPT:
        return {"name": watch.name, "kind": "corrupted", "frac": float(off.double().mean()), "max": float((sent - value).abs().max())}
    return None


def after_sync(engine: Any) -> None:
    """After vLLM loaded one ``load_weights`` call: the sent elements become the last sync's, and
    each matrix sent for the first time is calibrated (vLLM holds exactly what was sent)."""
    state: Optional[Weights] = getattr(engine, "weights", None)
    if state is None or state.open is None:
        return
    state.synced_since_generate = True
    for name, watch in state.watches.items():
        if watch.sent is None:
            continue
        held = watch.engine_values(state.params[name])
        if watch.verified is None:
            watch.verified = bool(held.equal(watch.sent))
            if not watch.verified:
                LEDGER.warn_once(f"W2-excluded:{name}", f"W2 does not verify {name}: vLLM stores it transformed (not what was sent)")
        watch.previous, watch.last, watch.sent = watch.last, watch.sent, None
        state.open["names_loaded"] = True


def _close(engine: Any, state: Weights) -> None:
    """Judge the sync just sent (W1), at the next ``generate`` or at a sync of a later step."""
    sync, state.open = state.open, None
    if sync is None:
        return
    trainer = sync["trainer"]
    if sync["count"] == 0 and trainer is not None and _trainer_moved(state, trainer):
        LEDGER.fire(
            Alarm(
                "W1",
                f"the weight sync of step {sync['step']} sent no tensor to vLLM although the trainer's weights changed",
                "a weight sync that sends nothing (TRL 0.18/0.19 under FSDP2, PR #3687)",
                fix="fsdp2-vllm-sync",
                figures={"sync_step": sync["step"], "sent": 0},
            )
        )
    LEDGER.add("weights_sent", sync["count"])
    if sync["count"] and trainer is not None:
        missing = [
            n for n, w in state.watches.items() if n not in sync["names"] and w.trainer_last is not None and _changed(trainer, w)
        ]
        if missing:
            LEDGER.fire(
                Alarm(
                    "W1",
                    f"the weight sync of step {sync['step']} sent {sync['count']} tensors but not {', '.join(missing)}, "
                    "which the trainer changed since the last sync",
                    "a partial weight sync (names vLLM does not get, or parameters skipped)",
                    figures={"sync_step": sync["step"], "sent": sync["count"], "missing": missing},
                )
            )
    for finding in sync["findings"]:
        _fire_content(sync, finding)


def _fire_content(sync: dict, finding: dict) -> None:
    name, frac, kind = finding["name"], finding["frac"], finding["kind"]
    figures = {"sync_step": sync["step"], "tensor": name, "kind": kind, "frac": round(frac, 4), "max_abs_diff": finding["max"]}
    if kind == "unmerged":
        what = (
            f"the weight sync of step {sync['step']} sent {name} equal to the LoRA base weight on every sampled element, "
            f"although the adapter (s*B@A) moves {frac:.1%} of them: vLLM gets the un-merged base model"
        )
        cause, fix = "the adapter was unmerged before vLLM loaded the merged state dict (TRL 0.15.0, #2856)", "vllm-merged-weights"
    elif kind == "corrupted":
        what = f"the weight sync of step {sync['step']} sent {name} off the merged LoRA weight on {frac:.1%} of sampled elements"
        cause, fix = "a wrong merge of the adapter into the sent weights", None
    else:
        what = (
            f"the weight sync of step {sync['step']} sent {name} differing from the trainer's weight on {frac:.1%} of sampled elements"
        )
        cause, fix = "a stale or wrong copy of the weights was sent", None
    LEDGER.fire(Alarm("W1", what, cause, fix=fix, figures=figures))


def _changed(trainer: Any, watch: Watch) -> bool:
    now = expected(trainer, watch)
    return now is not None and watch.trainer_last is not None and not bool(now["value"].equal(watch.trainer_last))


def _trainer_moved(state: Weights, trainer: Any) -> bool:
    return any(_changed(trainer, w) for w in state.watches.values())


# -- W2: the engine at generate -----------------------------------------------------------------------------


def before_generate(engine: Any) -> None:
    """W1 on the sync just made (or on the missing one), then W2: vLLM's watched elements vs the last sync."""
    state: Optional[Weights] = getattr(engine, "weights", None)
    if state is None or not state.watches:
        return
    trainer = _trainer(engine)
    step = _trainers.global_step(trainer)
    if state.open is not None:
        _close(engine, state)
    elif trainer is not None and state.generated_at is not None and step > state.generated_at and not state.synced_since_generate:
        _no_sync(state, trainer, step)
    if trainer is not None:
        for watch in state.watches.values():
            if watch.trainer_last is None:  # the trainer's starting point, for telling that it moved
                now = expected(trainer, watch)
                watch.trainer_last = now["value"] if now is not None else None
    state.generated_at, state.synced_since_generate = step, False
    _check_engine(state)


def _no_sync(state: Weights, trainer: Any, step: int) -> None:
    moved = [n for n, w in state.watches.items() if _changed(trainer, w)]
    if not moved:
        return
    LEDGER.fire(
        Alarm(
            "W1",
            f"vLLM generates at step {step} but no weight was sent to it since step {state.generated_at}, "
            f"although the trainer changed {', '.join(moved)}",
            "the weight sync sends nothing (TRL 0.18/0.19 under FSDP2 skip every non-FSDP1 module, PR #3687)",
            fix="fsdp2-vllm-sync",
            figures={"since_step": state.generated_at, "sent": 0, "moved": moved},
        )
    )
    for name in moved:  # alarm once per change
        now = expected(trainer, state.watches[name])
        state.watches[name].trainer_last = now["value"] if now is not None else None


def _check_engine(state: Weights) -> None:
    verifiable = [w for w in state.watches.values() if w.verified is not False]
    if not verifiable:
        LEDGER.warn_once("W2-unavailable", "W2 unavailable: vLLM stores every watched matrix transformed")
        return
    worst: Optional[Tuple[float, Watch, Any, Any]] = None
    for watch in verifiable:
        reference = watch.last if watch.last is not None else watch.checkpoint
        held = watch.engine_values(state.params[watch.name])
        differ = held != reference
        if bool(differ.any()):
            frac = float(differ.double().mean())
            if worst is None or frac > worst[0]:
                worst = (frac, watch, held, reference)
    LEDGER.add("weights_mismatch_frac", worst[0] if worst else 0.0)
    if worst is None:
        return
    frac, watch, held, reference = worst
    if held.equal(watch.checkpoint):
        kind, cause = (
            "vLLM holds the initial/on-disk weights",
            "the checkpoint was reloaded or the sync was lost (TRL #5312: sleep mode's reload_weights after the sync)",
        )
        fix = "vllm-sleep-mode-weights"
    elif watch.previous is not None and held.equal(watch.previous):
        kind, cause, fix = "vLLM is one sync behind", "the last sync did not reach the weights vLLM generates with", None
    else:
        kind, cause, fix = (
            "vLLM's weights are corrupted (neither the last sync, the one before, nor the checkpoint)",
            "the weights were discarded (sleep level 2 without a reload or re-sync, vLLM #29341) or overwritten",
            None,
        )
    max_diff = float((held.double() - reference.double()).abs().max())
    LEDGER.fire(
        Alarm(
            "W2",
            f"{kind}: {watch.name} differs from the last weight sync on {frac:.1%} of {len(watch.index)} sampled elements "
            f"(max |diff| {max_diff:.3g})",
            cause,
            fix=fix,
            figures={"tensor": watch.name, "frac": round(frac, 4), "max_abs_diff": max_diff, "kind": kind.split(" (")[0]},
        )
    )
