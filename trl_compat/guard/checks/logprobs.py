"""Check L: vLLM's log-probs of the sampled tokens against the trainer's (research §4).

Per completion, over its tokens with a finite vLLM log-prob, ``m_i = mean_t(e^Δ - Δ - 1)`` with
``Δ = logp_train - logp_vllm`` clipped to ±5 (the k3 estimate of KL(π_vllm ‖ π_train), verl's
``k3_kl``, NeMo RL's ``gen_kl_error``). Per generation batch (one vLLM ``generate`` call) and per
rank, ``D`` is the median of ``m_i`` over the completions the loss computed log-probs for at the
step they were generated (the policy, not the reference model; no optimizer step in between). Not
gathered across ranks: each rank judges its own completions, and in strict mode one rank's alarm
stops every rank (the callback's all_reduce). A median ignores single-token outliers of healthy
runs; gross faults move most completions.

Thresholds τ per precision class (nats per token): both sides float32 1e-3; 16-bit 0.05; MoE or
quantised 0.2. ERROR when ``D > τ`` on 2 consecutive batches, or ``D > 10τ`` once; a batch counts
only with at least ``MIN_COMPLETIONS`` completions and ``MIN_TOKENS`` tokens (fewer: no decision).

The comparability gate (§3.3), per completion: vLLM's log-probs are raw (V1; ``logprobs_mode``
``raw_logprobs``) or processed (V0, or ``processed_logprobs``). Raw ones compare with the loss's
only at loss temperature 1, and so do vLLM 0.10.0 / 0.10.1's processed ones (taken before the
temperature); other processed ones at the temperature vLLM sampled with. Top-k/top-p/min-p,
penalties and guided decoding make the sampling distribution differ from the loss's on purpose:
not compared. What is not compared is "unavailable" with its reason, logged once.

Where TRL does not ask vLLM for log-probs (0.14 - 0.22), :func:`ask_for_logprobs` sets
``logprobs=0`` on the SamplingParams for the call and restores it after (no RNG is used for it:
sampling is unchanged).
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from trl_compat._helpers import vllm_logprobs
from trl_compat.guard import _trainers
from trl_compat.guard._alarms import LEDGER, Alarm

CLIP = 5.0
MIN_COMPLETIONS = 8
MIN_TOKENS = 256
PERSIST = 2  # consecutive batches over τ
GROSS = 10.0  # × τ, once
TAU = {"fp32": 1e-3, "16-bit": 0.05, "moe/quantised": 0.2}
TEMPERATURE_TOLERANCE = 1e-6

_callers: Dict[type, Any] = {}


@dataclass
class Batch:
    call: int
    step: int
    tau: float
    precision: str
    kl: List[float] = field(default_factory=list)  # m_i per completion
    abs_diff: float = 0.0  # sum of |Δ| over tokens
    diff: float = 0.0  # sum of Δ
    tokens: int = 0


_open: Dict[int, Batch] = {}
_over = 0  # consecutive decided batches with D > τ
_last_d: List[float] = []  # the D of each decided batch (this process), for reports and tests


# -- asking vLLM for log-probs -------------------------------------------------------------------------------


def ask_for_logprobs(args: tuple, kwargs: dict) -> Optional[Callable[[], None]]:
    """Where the caller did not ask vLLM for log-probs, ask (``logprobs=0``); returns how to undo it.
    Only for a GRPO trainer's own generate calls."""
    flush()
    if _trainers.calling_trainer() is None:
        return None
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    objects = list(params) if isinstance(params, (list, tuple)) else [params]
    changed: List[Any] = []
    for obj in objects:
        if obj is None or isinstance(obj, dict) or not hasattr(obj, "logprobs") or obj.logprobs is not None:
            continue
        if any(o is obj for o in changed):
            continue
        obj.logprobs = 0
        changed.append(obj)
    if not changed:
        return None

    def restore() -> None:
        for obj in changed:
            obj.logprobs = None

    return restore


def sampled_logprobs(ids: Tuple[int, ...], logprobs: Any) -> Optional[Tuple[float, ...]]:
    """vLLM's log-prob of each sampled token (``logprobs[t][ids[t]].logprob``), or None."""
    if not logprobs or len(logprobs) != len(ids):
        return None
    values = []
    for token, entry in zip(ids, logprobs):
        found = entry.get(token) if isinstance(entry, dict) else None
        if found is None:
            return None
        value: Any = getattr(found, "logprob", found)
        values.append(float(value))
    return tuple(values)


# -- the gate -------------------------------------------------------------------------------------------------


def domain(engine: Any) -> Optional[str]:
    """ "raw" or "processed": which log-probs the engine returns (None: unknown, e.g. a server)."""
    if engine is None:
        return None
    mode = getattr(engine, "logprobs_mode", None)
    if mode:
        return "raw" if str(mode).startswith("raw") else "processed"
    llm = engine.llm() if callable(getattr(engine, "llm", None)) else None
    core = getattr(llm, "llm_engine", None)
    if core is None:
        return None
    return "raw" if type(core).__module__.startswith("vllm.v1") else "processed"  # V1 raw, V0 processed


def loss_temperature(trainer: Any) -> float:
    from trl_compat._helpers import logps_calls
    from trl_compat.guard.checks import sampling

    cls = type(trainer)
    if cls not in _callers:
        _callers[cls] = logps_calls.find(cls)
    caller = _callers[cls]
    return sampling.loss_temperature(trainer, caller) if caller is not None else 1.0


def unavailable(sampled: Any, loss_t: float, trainer: Any) -> Optional[str]:
    """Why this completion cannot be compared (None: it can)."""
    if sampled.logprobs is None:
        return "vLLM returned no log-probs for these completions"
    truncated = sampled.sampling.truncated()
    if truncated:
        return f"vLLM samples with {', '.join(truncated)}: its distribution is deliberately not the loss's"
    kind = domain(sampled.engine)
    used = sampled.sampling.temperature
    if kind == "raw":
        if abs(loss_t - 1.0) > TEMPERATURE_TOLERANCE:
            return f"vLLM returns raw (temperature 1) log-probs and the loss computes them at temperature {loss_t:g}"
    elif kind == "processed" and _processed_without_temperature():
        if abs(loss_t - 1.0) > TEMPERATURE_TOLERANCE:
            return (
                f"vLLM {'.'.join(map(str, vllm_logprobs.vllm_version() or ()))}'s processed log-probs are taken before "
                f"the temperature and the loss computes them at temperature {loss_t:g}"
            )
    elif kind == "processed":
        if used is None or used < 1e-5:
            return "greedy decoding: vLLM's processed log-probs are not the loss's"
        if abs(used - loss_t) > TEMPERATURE_TOLERANCE:
            return f"vLLM's processed log-probs are at temperature {used:g}, the loss's at {loss_t:g}"
    else:
        return "which log-probs the engine returns (raw or processed) is unknown"
    if _dropout(trainer):
        return "the policy has active dropout: its log-probs are noisy"
    return None


@functools.lru_cache(maxsize=1)
def _processed_without_temperature() -> bool:
    """vLLM 0.10.0 / 0.10.1.x (V1) take "processed" log-probs after the penalties but before the
    temperature and top-k/top-p (``_helpers.vllm_logprobs``); 0.10.2's include the temperature.
    Read once: the installed vLLM does not change during a run (its metadata costs a file read)."""
    version = vllm_logprobs.vllm_version()
    return version is not None and vllm_logprobs.FIELD_SINCE <= version < vllm_logprobs.TEMPERATURE_SURE_SINCE


def _dropout(trainer: Any) -> bool:
    model = getattr(trainer, "model", None)
    if model is None or not getattr(model, "training", False) or not hasattr(model, "modules"):
        return False
    return any(type(m).__name__.startswith("Dropout") and getattr(m, "p", 0) > 0 and m.training for m in model.modules())


def precision(engine: Any, values: Any) -> str:
    """The precision class of one comparison: vLLM's dtype and the trainer's log-prob dtype."""
    import torch

    llm = engine.llm() if engine is not None and callable(getattr(engine, "llm", None)) else None
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    hf = getattr(config, "hf_config", None) or getattr(llm, "hf_config", None)
    if getattr(config, "quantization", None) or any(
        getattr(hf, name, None) for name in ("num_experts", "num_local_experts", "n_routed_experts", "moe_intermediate_size")
    ):
        return "moe/quantised"
    kv = getattr(getattr(getattr(llm, "llm_engine", None), "cache_config", None), "cache_dtype", None)
    if kv not in (None, "auto"):
        return "moe/quantised"
    vllm_dtype = getattr(config, "dtype", None) or getattr(llm, "dtype", None)
    if vllm_dtype is None and engine is not None and engine.model is not None:
        vllm_dtype = next(iter(engine.model.parameters()), torch.empty(0)).dtype
    trainer_dtype = getattr(values, "dtype", None)
    if vllm_dtype == torch.float32 and trainer_dtype == torch.float32:
        return "fp32"
    return "16-bit"


# -- the statistic -------------------------------------------------------------------------------------------


def compare(trainer: Any, rows: list) -> None:
    """L on the matched rows: ``[(sampled, trainer_logps_row (1-D tensor of the completion's tokens))]``."""
    import torch

    loss_t = loss_temperature(trainer)
    for sampled, values in rows:
        reason = unavailable(sampled, loss_t, trainer)
        if reason is not None:
            LEDGER.warn_once("L:" + reason, f"check L unavailable for some completions: {reason}")
            continue
        vllm = torch.tensor(sampled.logprobs, dtype=torch.float64)
        train = values.detach()[: len(vllm)].to("cpu", torch.float64)
        if len(train) != len(vllm):
            continue
        finite = torch.isfinite(vllm) & torch.isfinite(train)
        if not bool(finite.any()):
            continue
        delta = (train - vllm)[finite].clamp(-CLIP, CLIP)
        batch = _open.get(sampled.call)
        if batch is None:
            kind = precision(sampled.engine, values)
            batch = _open[sampled.call] = Batch(sampled.call, sampled.step, TAU[kind], kind)
        batch.kl.append(float((delta.exp() - delta - 1).mean()))
        batch.abs_diff += float(delta.abs().sum())
        batch.diff += float(delta.sum())
        batch.tokens += int(delta.numel())


def flush() -> None:
    """Decide the batches compared so far (at the end of each optimizer step and before each generate)."""
    global _over
    for call in sorted(_open):
        batch = _open.pop(call)
        if len(batch.kl) < MIN_COMPLETIONS or batch.tokens < MIN_TOKENS:
            LEDGER.warn_once(
                "L:small",
                f"check L decides nothing on batches of fewer than {MIN_COMPLETIONS} completions or {MIN_TOKENS} tokens "
                f"(one had {len(batch.kl)} completions, {batch.tokens} tokens)",
            )
            continue
        d = statistics.median(batch.kl)
        _last_d.append(d)
        LEDGER.add("kl_k3_median", d)
        LEDGER.add("logp_abs_diff_mean", batch.abs_diff / batch.tokens)
        LEDGER.add("logp_diff_mean", batch.diff / batch.tokens)
        LEDGER.add("tokens", batch.tokens)
        _over = _over + 1 if d > batch.tau else 0
        if d > GROSS * batch.tau or _over >= PERSIST:
            _fire(batch, d)


def _fire(batch: Batch, d: float) -> None:
    saved, LEDGER.step = LEDGER.step, batch.step
    try:
        rule = f"> {GROSS:g}τ" if d > GROSS * batch.tau else f"> τ on {_over} consecutive batches"
        cause = (
            "an engine, prompt or configuration mismatch, not staleness (no optimizer step yet)"
            if batch.step == 0
            else "vLLM generates from other weights, another model or configuration, or other prompts than the loss"
        )
        LEDGER.fire(
            Alarm(
                "L",
                f"vLLM's log-probs disagree with the trainer's: D = median k3 KL per completion = {d:.3g} "
                f"({rule}, τ = {batch.tau:g}, {batch.precision}) over {len(batch.kl)} completions, {batch.tokens} tokens; "
                f"mean |Δ| = {batch.abs_diff / batch.tokens:.3g}",
                cause,
                figures={
                    "D": d,
                    "tau": batch.tau,
                    "precision": batch.precision,
                    "completions": len(batch.kl),
                    "tokens": batch.tokens,
                    "abs_diff_mean": batch.abs_diff / batch.tokens,
                    "generated_at": batch.step,
                },
            )
        )
    finally:
        LEDGER.step = saved


def decided() -> List[float]:
    """The D of every batch decided in this process so far (oldest first)."""
    return list(_last_d)


def reset() -> None:
    global _over
    _open.clear()
    _over = 0
    _last_d.clear()
    _callers.clear()
