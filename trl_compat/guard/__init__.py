"""The off-policy guard: checks, while a GRPO run trains, that vLLM generated from the trainer's
weights, the loss's prompts and the loss's sampling settings. Off by default.

``TRL_COMPAT_GUARD=1`` (or :func:`enable`) turns it on in every process that imports trl_compat;
``TRL_COMPAT_GUARD=strict`` (``enable(strict=True)``) also raises :class:`OffPolicyError` on
every rank at the end of an optimizer step in which any rank alarmed.

The checks (README, "The off-policy guard"): P prompt ids, S sampling temperature, C engine call
order around weight syncs, W1 what each sync sent, W2 the weights vLLM holds at ``generate``,
L log-prob agreement. They hook vLLM's public surface (``LLM`` and TRL's ``VLLMClient``), not
TRL's internals, and match completions to the loss's rows by their token ids. An alarm is one
ERROR line on the ``trl_compat.guard`` logger and ``offpolicy/*`` values in the logged metrics.
"""

from __future__ import annotations

from typing import Dict

from trl_compat.guard._alarms import CHECKS, LEDGER, Alarm, OffPolicyError
from trl_compat.guard._control import active, disable, enable, is_strict, mode, observing

__all__ = ["CHECKS", "Alarm", "OffPolicyError", "active", "alarms", "disable", "enable", "is_strict", "mode", "observing", "stats"]


def alarms() -> list:
    """Every alarm raised in this process so far (oldest first)."""
    with LEDGER.lock:
        return list(LEDGER.alarms)


def stats() -> Dict[str, int]:
    """This process's counts: optimizer steps guarded (ended with vLLM generations behind them),
    vLLM generate calls, loss rows checked against vLLM's completions, alarms (all; and those fired
    outside ``observing()``, which strict mode raises)."""
    return {
        "steps_guarded": LEDGER.steps_guarded,
        "generations": LEDGER.generations,
        "rows_checked": LEDGER.rows_checked,
        "alarms": len(LEDGER.alarms),
        "alarms_unobserved": sum(1 for a in LEDGER.alarms if not a.observed),
    }
