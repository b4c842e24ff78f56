"""Check S: the temperature vLLM sampled with == the one the loss divides the logits by.

Exact, once per generate call. The loss's temperature: ``GRPOTrainer.temperature`` where TRL's
log-prob function divides by it (TRL 0.16+); 1 where it does not (0.14/0.15), unless trl_compat's
opt-in ``logps-temperature`` fix is applied. Top-k/top-p/min-p, penalties and guided decoding are
reported once as a warning, not an alarm: generation is then deliberately not the loss's policy
(TRL #6789's bias), which is a configuration, not a bug.
"""

from __future__ import annotations

from typing import Any

from trl_compat._engine.patch import APPLIED
from trl_compat._engine.reporting import status
from trl_compat.guard._ledger import LEDGER, Alarm
from trl_compat.guard._records import Sampled
from trl_compat.guard._run import Run

TOLERANCE = 1e-6


def loss_temperature(trainer: Any, caller: Any) -> float:
    if "temperature" in caller.code:
        value = getattr(trainer, "temperature", None)
        return float(value) if isinstance(value, (int, float)) else 1.0
    if status("logps-temperature") == APPLIED:
        value = getattr(getattr(trainer, "args", None), "temperature", None)
        if isinstance(value, (int, float)) and value > 0:
            return float(value)
    return 1.0


def check(run: Run, trainer: Any, caller: Any, sampled: list[Sampled]) -> None:
    """S on the completions of generate calls the run has not checked yet, once per call."""
    calls: dict[int, Sampled] = {}
    for s in sampled:
        if s.call not in run.seen_calls:
            calls.setdefault(s.call, s)
    if not calls:
        return
    assumed = loss_temperature(trainer, caller)
    for number, s in calls.items():
        run.seen_calls.add(number)
        truncated = s.sampling.truncated()
        if truncated:
            LEDGER.warn_once(
                "S:" + ",".join(truncated),
                f"vLLM samples with {', '.join(truncated)}: generation is deliberately not the policy the loss trains "
                "(importance ratios are biased by the truncated mass, TRL #6789); check L skips these completions",
            )
        used = s.sampling.temperature
        if used is None or used < 1e-5 or abs(used - assumed) <= TOLERANCE:
            continue  # greedy decoding has no temperature to agree on
        opt_in = "temperature" not in caller.code
        run.fire(
            Alarm(
                "S",
                f"vLLM sampled at temperature {used:g}, the loss computes log-probs at temperature {assumed:g}",
                "TRL < 0.16 computes log-probs at temperature 1 (PR #3029)"
                if opt_in
                else "a sampling override (generation_kwargs, a vLLM default) set a temperature the loss does not use",
                fix="logps-temperature" if opt_in else None,
                figures={"vllm_temperature": used, "loss_temperature": assumed},
                step=run.step,
            )
        )
