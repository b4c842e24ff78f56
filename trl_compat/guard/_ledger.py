"""What the guard says when a check fires, and what this process counts (floor 1).

An alarm is logged once per check and optimizer step at ERROR on ``trl_compat.guard``, naming the
check, its figures, the step and rank, the likely cause and, where one exists, the patch that
fixes it, and at the step it carries (the step its check judged, given by the check). The run's
``offpolicy/*`` figures count it too (:mod:`._run`). In strict mode
the callback raises :class:`OffPolicyError` on every rank at the end of the optimizer step in which
any rank alarmed (one ``all_reduce`` of one number), so that no rank is left waiting in a
collective for a rank that raised.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass, field

from trl_compat.guard._mode import log, observing_now

CHECKS = {
    "P": "prompt ids vLLM generated from == the loss's prompt ids",
    "S": "sampling parameters vLLM used == what the loss assumes",
    "C": "engine calls: no stale prefix cache, reload, discard or offload between a weight sync and generate",
    "W1": "what each weight sync sent == the trainer's weights",
    "W2": "the weights vLLM holds at generate == the last sync",
    "L": "vLLM's log-probs of the sampled tokens agree with the trainer's",
}


class OffPolicyError(RuntimeError):
    """``TRL_COMPAT_GUARD=strict``: vLLM generated from something other than what the loss trains on."""


@dataclass
class Alarm:
    check: str  # a key of CHECKS
    what: str  # the finding, with its figures
    cause: str  # the likely cause
    fix: str | None = None  # the trl_compat patch id that fixes it, where one does
    figures: dict[str, object] = field(default_factory=dict)
    step: int = 0  # the optimizer step it belongs to: set by the check that fires it
    rank: int = 0
    observed: bool = False  # fired inside guard.observing() (a bug reproduced on purpose): never raised

    def line(self) -> str:
        text = f"off-policy check {self.check} ({CHECKS[self.check]}) failed at step {self.step}, rank {self.rank}: {self.what}"
        text += f"; likely cause: {self.cause}"
        if self.fix:
            text += f"; fixed by trl_compat's `{self.fix}` patch (is it switched off? python -m trl_compat)"
        return text


def rank() -> int:
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0") or 0)


class Ledger:
    """The guard's counts in this process: alarms (all, and those not yet raised), the steps
    guarded, the generate calls and rows checked. Per-run figures live in each run (:mod:`._run`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.alarms: list[Alarm] = []
        self.unraised: list[Alarm] = []
        self._logged: set[tuple[str, int]] = set()
        self._warned: set[str] = set()
        self.steps_guarded = 0  # optimizer steps that ended with at least one guarded generation behind them
        self.generations = 0  # vLLM generate calls seen
        self.rows_checked = 0  # completions matched to a loss row and compared

    def fire(self, alarm: Alarm) -> None:
        """Log (once per check and step) and count ``alarm``, at the step it carries."""
        alarm.rank = rank()
        alarm.observed = observing_now()
        with self.lock:
            self.alarms.append(alarm)
            if not alarm.observed:  # an alarm of an observing() block is never raised, not even after it
                self.unraised.append(alarm)
            key = (alarm.check, alarm.step)
            if key in self._logged:
                return
            self._logged.add(key)
        log.error("trl_compat: %s", alarm.line())

    def warn_once(self, key: str, message: str) -> None:
        with self.lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("trl_compat: off-policy guard: %s", message)

    def new_generation(self) -> int:
        """Count one guarded generate call; returns its number (1, 2, ...) in this process."""
        with self.lock:
            self.generations += 1
            return self.generations

    def take_unraised(self) -> list[Alarm]:
        with self.lock:
            taken, self.unraised = self.unraised, []
        return taken


LEDGER = Ledger()


def error_for(alarms: list[Alarm], elsewhere: bool) -> OffPolicyError:
    if alarms:
        lines = "\n".join(a.line() for a in alarms[:8])
        more = f"\n(and {len(alarms) - 8} more)" if len(alarms) > 8 else ""
        return OffPolicyError(f"TRL_COMPAT_GUARD=strict: {len(alarms)} off-policy alarm(s) on rank {rank()}:\n{lines}{more}")
    return OffPolicyError(
        f"TRL_COMPAT_GUARD=strict: another rank raised an off-policy alarm (rank {rank()} saw none; see that rank's log)"
    )
