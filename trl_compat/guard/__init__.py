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

Floors, each importing only those below it:

1. ``_mode`` (the switch, ``observing()``, ``pause()``, the guard's id and logger), ``_ledger``
   (alarms and this process's counts), ``_records`` (completions), ``_run`` (one :class:`Run`
   per adopted trainer), ``_engines`` (one record per vLLM engine);
2. ``checks/``: P, S, C, W1/W2, L, functions of (run, engine record, observation);
3. ``observe/``: the hooks on vLLM, TRL's client, the loss, transformers' callbacks;
4. ``_install``: :func:`enable` / :func:`disable`. ``_describe`` (``python -m trl_compat``) and
   ``testing`` (the tests' surface) stand aside.

Rules (held by tests/guard/test_floors.py):

* ``checks/`` never imports ``observe/`` or ``_install``; nothing below ``_install`` imports it;
* only ``observe/trainers.py`` walks the stack;
* every alarm carries the step it belongs to (the check sets it: no "current step" global);
* a run's state dies with its trainer (runs are held weakly): two trainers in one process share
  no streak, seen call, figure or pending completion.
"""

from __future__ import annotations

from trl_compat.guard._install import disable, enable, from_environment
from trl_compat.guard._ledger import CHECKS, LEDGER, Alarm, OffPolicyError
from trl_compat.guard._mode import active, is_strict, mode, observing, pause

__all__ = [
    "CHECKS",
    "Alarm",
    "OffPolicyError",
    "active",
    "alarms",
    "disable",
    "enable",
    "from_environment",
    "is_strict",
    "mode",
    "observing",
    "pause",
    "stats",
]


def alarms() -> list[Alarm]:
    """Every alarm raised in this process so far (oldest first)."""
    with LEDGER.lock:
        return list(LEDGER.alarms)


def stats() -> dict[str, int]:
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
