"""Check L's gate (see :mod:`.logprobs`): which completions' log-probs can be compared with the
loss's, and the precision class that sets τ; vLLM's log-prob of each sampled token."""

from __future__ import annotations

import functools
from typing import Any

from trl_compat._helpers import vllm_logprobs
from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._records import Sampled
from trl_compat.guard._run import Run
from trl_compat.guard.checks import sampling

TEMPERATURE_TOLERANCE = 1e-6


def sampled_logprobs(ids: tuple[int, ...], logprobs: Any) -> tuple[float, ...] | None:
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


def domain(engine: EngineRecord | None) -> str | None:
    """ "raw" or "processed": which log-probs the engine returns (None: unknown, e.g. a server)."""
    if engine is None:
        return None
    mode = getattr(engine, "logprobs_mode", None)
    if mode:
        return "raw" if str(mode).startswith("raw") else "processed"
    llm = engine.engine() if isinstance(engine, EngineRecord) else None
    core = getattr(llm, "llm_engine", None)
    if core is None:
        return None
    return "raw" if type(core).__module__.startswith("vllm.v1") else "processed"  # V1 raw, V0 processed


def loss_temperature(run: Run) -> float:
    """The temperature the run's loss computes log-probs at."""
    trainer = run.trainer
    return sampling.loss_temperature(trainer, run.caller) if trainer is not None and run.caller is not None else 1.0


def unavailable(sampled: Sampled, loss_t: float, dropout: bool) -> str | None:
    """Why this completion cannot be compared (None: it can); ``dropout``: the policy has active
    dropout (:func:`active_dropout`, once per log-prob call, not per completion)."""
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
    if dropout:
        return "the policy has active dropout: its log-probs are noisy"
    return None


@functools.lru_cache(maxsize=1)
def _processed_without_temperature() -> bool:
    """vLLM 0.10.0 / 0.10.1.x (V1) take "processed" log-probs after the penalties but before the
    temperature and top-k/top-p (``_helpers.vllm_logprobs``); 0.10.2's include the temperature.
    Read once: the installed vLLM does not change during a run (its metadata costs a file read)."""
    version = vllm_logprobs.vllm_version()
    return version is not None and vllm_logprobs.FIELD_SINCE <= version < vllm_logprobs.TEMPERATURE_SURE_SINCE


def active_dropout(trainer: Any) -> bool:
    model = getattr(trainer, "model", None)
    if model is None or not getattr(model, "training", False) or not hasattr(model, "modules"):
        return False
    return any(type(m).__name__.startswith("Dropout") and getattr(m, "p", 0) > 0 and m.training for m in model.modules())


def precision(engine: EngineRecord | None, values: Any) -> str:
    """The precision class of one comparison: vLLM's dtype and the trainer's log-prob dtype."""
    import torch

    llm = engine.engine() if engine is not None else None
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
