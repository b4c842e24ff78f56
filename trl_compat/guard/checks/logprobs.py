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

The gate and the precision classes are in :mod:`.logprobs_gate`. Where TRL does not ask vLLM for
log-probs (0.14 - 0.22), the vLLM observer asks (``observe.vllm.ask_for_logprobs``). Every figure
is the run's (:class:`~trl_compat.guard._run.Run`): two trainers in one process never share a
batch or a streak.
"""

from __future__ import annotations

import statistics
from typing import Any

from trl_compat.guard._ledger import LEDGER, Alarm
from trl_compat.guard._records import Batch, Sampled
from trl_compat.guard._run import Run
from trl_compat.guard.checks.logprobs_gate import active_dropout, loss_temperature, precision, unavailable

CLIP = 5.0
MIN_COMPLETIONS = 8
MIN_TOKENS = 256
PERSIST = 2  # consecutive batches over τ
GROSS = 10.0  # × τ, once
TAU = {"fp32": 1e-3, "16-bit": 0.05, "moe/quantised": 0.2}


def compare(run: Run, rows: list[tuple[Sampled, Any]]) -> None:
    """L on the matched rows: ``[(sampled, trainer_logps_row (1-D tensor of the completion's tokens))]``."""
    import torch

    loss_t = loss_temperature(run)
    dropout = active_dropout(run.trainer)
    for sampled, values in rows:
        reason = unavailable(sampled, loss_t, dropout)
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
        batch = run.open_batches.get(sampled.call)
        if batch is None:
            kind = precision(sampled.engine, values)
            batch = run.open_batches[sampled.call] = Batch(sampled.call, sampled.step, TAU[kind], kind)
        batch.kl.append(float((delta.exp() - delta - 1).mean()))
        batch.abs_diff += float(delta.abs().sum())
        batch.diff += float(delta.sum())
        batch.tokens += int(delta.numel())


def flush(run: Run) -> None:
    """Decide the run's batches compared so far (at the end of each optimizer step and before each generate)."""
    for call in sorted(run.open_batches):
        batch = run.open_batches.pop(call)
        if len(batch.kl) < MIN_COMPLETIONS or batch.tokens < MIN_TOKENS:
            LEDGER.warn_once(
                "L:small",
                f"check L decides nothing on batches of fewer than {MIN_COMPLETIONS} completions or {MIN_TOKENS} tokens "
                f"(one had {len(batch.kl)} completions, {batch.tokens} tokens)",
            )
            continue
        d = statistics.median(batch.kl)
        run.decided.append(d)
        run.add("kl_k3_median", d)
        run.add("logp_abs_diff_mean", batch.abs_diff / batch.tokens)
        run.add("logp_diff_mean", batch.diff / batch.tokens)
        run.add("tokens", batch.tokens)
        run.streak = run.streak + 1 if d > batch.tau else 0
        if d > GROSS * batch.tau or run.streak >= PERSIST:
            _fire(run, batch, d)


def _fire(run: Run, batch: Batch, d: float) -> None:
    rule = f"> {GROSS:g}τ" if d > GROSS * batch.tau else f"> τ on {run.streak} consecutive batches"
    cause = (
        "an engine, prompt or configuration mismatch, not staleness (no optimizer step yet)"
        if batch.step == 0
        else "vLLM generates from other weights, another model or configuration, or other prompts than the loss"
    )
    run.fire(
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
            step=batch.step,
        )
    )
