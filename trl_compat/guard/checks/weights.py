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

from typing import Any

from trl_compat._engine import guarded
from trl_compat.guard._engines import EngineRecord, Finding, Sync, Watch, Weights
from trl_compat.guard._ledger import LEDGER, Alarm
from trl_compat.guard._mode import GUARD_ID, log
from trl_compat.guard._run import Run, add, fire, global_step, run_of
from trl_compat.guard.checks.watched import compare_sent, engine_built, expected, vllm_name

__all__ = ["Watch", "after_sync", "audit_sync", "before_generate", "engine_built", "vllm_name"]


# -- W1: the sync ------------------------------------------------------------------------------------------


def audit_sync(engine: EngineRecord, trainer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Called with ``load_weights``' arguments before vLLM sees them (``trainer``: the one syncing,
    None if unknown); returns them, the iterable wrapped so that each (name, tensor) is recorded as
    vLLM takes it."""
    state = engine.weights
    if state is None:
        return args, kwargs
    step = global_step(trainer)
    if state.open is not None and state.open.step != step:
        _close(state)
    if state.open is None:
        state.open = Sync(step, trainer)
    sync = state.open
    if "weights" in kwargs:
        kwargs = dict(kwargs, weights=_recording(engine, state, sync, kwargs["weights"]))
    elif args:
        args = (_recording(engine, state, sync, args[0]),) + tuple(args[1:])
    return args, kwargs


def _recording(engine: EngineRecord, state: Weights, sync: Sync, weights: Any) -> Any:
    for item in weights:
        # the item goes on unchanged whatever happens here (errors re-raised only under TRL_COMPAT_STRICT)
        with guarded(GUARD_ID, "recording a sent tensor", fallback="this tensor is not audited", logger=log):
            if isinstance(item, tuple) and len(item) == 2:
                _record_one(state, sync, item[0], item[1])
        yield item


def _record_one(state: Weights, sync: Sync, name: str, tensor: Any) -> None:
    import torch

    sync.count += 1
    key = vllm_name(str(name))
    sync.names.add(key)
    watch = state.watches.get(key)
    if watch is None or not hasattr(tensor, "reshape") or tuple(tensor.shape) != watch.shape:
        return
    with torch.no_grad():
        sent = tensor.detach().reshape(-1)[watch.index.to(tensor.device)].to("cpu")
    watch.sent = sent.to(watch.dtype)
    wanted = expected(sync.trainer, watch) if sync.trainer is not None else None
    if wanted is None:
        return
    watch.trainer_last = wanted.value
    if wanted.local:
        return  # a shard (FSDP2): it tells a change, not the whole tensor's values
    finding = compare_sent(watch, sent.to(torch.float64), sent.dtype, wanted)
    if finding is not None:
        sync.findings.append(finding)


def after_sync(engine: EngineRecord) -> None:
    """After vLLM loaded one ``load_weights`` call: the sent elements become the last sync's, and
    each matrix sent for the first time is calibrated (vLLM holds exactly what was sent)."""
    state = engine.weights
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


def _close(state: Weights) -> None:
    """Judge the sync just sent (W1), at the next ``generate`` or at a sync of a later step; its
    alarms are dated to the sync's step."""
    sync, state.open = state.open, None
    if sync is None:
        return
    trainer = sync.trainer
    run = run_of(trainer) if trainer is not None else None
    if sync.count == 0 and trainer is not None and _trainer_moved(state, trainer):
        fire(
            run,
            Alarm(
                "W1",
                f"the weight sync of step {sync.step} sent no tensor to vLLM although the trainer's weights changed",
                "a weight sync that sends nothing (TRL 0.18/0.19 under FSDP2, PR #3687)",
                fix="fsdp2-vllm-sync",
                figures={"sync_step": sync.step, "sent": 0},
                step=sync.step,
            ),
        )
    add(run, "weights_sent", sync.count)
    if sync.count and trainer is not None:
        missing = [n for n, w in state.watches.items() if n not in sync.names and w.trainer_last is not None and _changed(trainer, w)]
        if missing:
            fire(
                run,
                Alarm(
                    "W1",
                    f"the weight sync of step {sync.step} sent {sync.count} tensors but not {', '.join(missing)}, "
                    "which the trainer changed since the last sync",
                    "a partial weight sync (names vLLM does not get, or parameters skipped)",
                    figures={"sync_step": sync.step, "sent": sync.count, "missing": missing},
                    step=sync.step,
                ),
            )
    for finding in sync.findings:
        _fire_content(run, sync, finding)


def _fire_content(run: Run | None, sync: Sync, finding: Finding) -> None:
    name, frac, kind = finding.name, finding.frac, finding.kind
    figures = {"sync_step": sync.step, "tensor": name, "kind": kind, "frac": round(frac, 4), "max_abs_diff": finding.max}
    if kind == "unmerged":
        what = (
            f"the weight sync of step {sync.step} sent {name} equal to the LoRA base weight on every sampled element, "
            f"although the adapter (s*B@A) moves {frac:.1%} of them: vLLM gets the un-merged base model"
        )
        cause, fix = "the adapter was unmerged before vLLM loaded the merged state dict (TRL 0.15.0, #2856)", "vllm-merged-weights"
    elif kind == "corrupted":
        what = f"the weight sync of step {sync.step} sent {name} off the merged LoRA weight on {frac:.1%} of sampled elements"
        cause, fix = "a wrong merge of the adapter into the sent weights", None
    else:
        what = f"the weight sync of step {sync.step} sent {name} differing from the trainer's weight on {frac:.1%} of sampled elements"
        cause, fix = "a stale or wrong copy of the weights was sent", None
    fire(run, Alarm("W1", what, cause, fix=fix, figures=figures, step=sync.step))


def _changed(trainer: Any, watch: Watch) -> bool:
    now = expected(trainer, watch)
    return now is not None and watch.trainer_last is not None and not bool(now.value.equal(watch.trainer_last))


def _trainer_moved(state: Weights, trainer: Any) -> bool:
    return any(_changed(trainer, w) for w in state.watches.values())


# -- W2: the engine at generate -----------------------------------------------------------------------------


def before_generate(engine: EngineRecord, trainer: Any) -> None:
    """W1 on the sync just made (or on the missing one), then W2: vLLM's watched elements vs the
    last sync. ``trainer``: the one generating with the engine (None: unknown)."""
    state = engine.weights
    if state is None or not state.watches:
        return
    step = global_step(trainer)
    run = run_of(trainer) if trainer is not None else None
    if state.open is not None:
        _close(state)
    elif trainer is not None and state.generated_at is not None and step > state.generated_at and not state.synced_since_generate:
        _no_sync(state, run, trainer, step)
    if trainer is not None:
        for watch in state.watches.values():
            if watch.trainer_last is None:  # the trainer's starting point, for telling that it moved
                now = expected(trainer, watch)
                watch.trainer_last = now.value if now is not None else None
    state.generated_at, state.synced_since_generate = step, False
    _check_engine(state, run, step)


def _no_sync(state: Weights, run: Run | None, trainer: Any, step: int) -> None:
    moved = [n for n, w in state.watches.items() if _changed(trainer, w)]
    if not moved:
        return
    fire(
        run,
        Alarm(
            "W1",
            f"vLLM generates at step {step} but no weight was sent to it since step {state.generated_at}, "
            f"although the trainer changed {', '.join(moved)}",
            "the weight sync sends nothing (TRL 0.18/0.19 under FSDP2 skip every non-FSDP1 module, PR #3687)",
            fix="fsdp2-vllm-sync",
            figures={"since_step": state.generated_at, "sent": 0, "moved": moved},
            step=step,
        ),
    )
    for name in moved:  # alarm once per change
        now = expected(trainer, state.watches[name])
        state.watches[name].trainer_last = now.value if now is not None else None


def _check_engine(state: Weights, run: Run | None, step: int) -> None:
    verifiable = [w for w in state.watches.values() if w.verified is not False]
    if not verifiable:
        LEDGER.warn_once("W2-unavailable", "W2 unavailable: vLLM stores every watched matrix transformed")
        return
    worst: tuple[float, Watch, Any, Any] | None = None
    for watch in verifiable:
        reference = watch.last if watch.last is not None else watch.checkpoint
        held = watch.engine_values(state.params[watch.name])
        differ = held != reference
        if bool(differ.any()):
            frac = float(differ.double().mean())
            if worst is None or frac > worst[0]:
                worst = (frac, watch, held, reference)
    add(run, "weights_mismatch_frac", worst[0] if worst else 0.0)
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
    fire(
        run,
        Alarm(
            "W2",
            f"{kind}: {watch.name} differs from the last weight sync on {frac:.1%} of {len(watch.index)} sampled elements "
            f"(max |diff| {max_diff:.3g})",
            cause,
            fix=fix,
            figures={"tensor": watch.name, "frac": round(frac, 4), "max_abs_diff": max_diff, "kind": kind.split(" (")[0]},
            step=step,
        ),
    )
