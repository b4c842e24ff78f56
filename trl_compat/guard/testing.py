"""The guard as its tests reach it: a run per trainer, an engine record, the ledger, the records
(as :mod:`trl_compat.testing` is for the engine). Not for users: the names here may change."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._ledger import LEDGER, Alarm, Ledger
from trl_compat.guard._records import Pending, Sampled, Sampling
from trl_compat.guard._run import Run, known_run, run_of
from trl_compat.guard.observe import callback as _callback
from trl_compat.guard.observe import trainers as _trainers

__all__ = [
    "LEDGER",
    "Alarm",
    "EngineRecord",
    "Ledger",
    "Pending",
    "Run",
    "Sampled",
    "Sampling",
    "decided",
    "engine_of",
    "figures",
    "known_run",
    "ledger_kept",
    "metrics",
    "new_run",
    "run_of",
    "sync_step",
]


class _Owner:
    """A stand-in trainer for a run made by a test (held by the run's caller)."""

    state = None


def new_run() -> Run:
    """A fresh run of a stand-in trainer, apart from the process's runs (its step is 0)."""
    owner = _Owner()
    run = Run(owner)
    run._owner = owner  # type: ignore[attr-defined]  # the run keeps its stand-in alive
    return run


def decided(trainer: Any) -> list[float]:
    """Check L's D of each batch the trainer's run decided (oldest first); [] if it has no run."""
    run = known_run(trainer)
    return list(run.decided) if run is not None else []


def figures(trainer: Any) -> dict[str, list[float]]:
    """The run's ``offpolicy/*`` figures not yet taken by a log."""
    run = known_run(trainer)
    return dict(run.figures) if run is not None else {}


def metrics(values: dict[str, list[float]]) -> dict[str, float]:
    return _callback.metrics(values)


def sync_step(engine: EngineRecord | None = None) -> int:
    """The step a weight sync made from the caller's frame is dated to (as an engine's hook does)."""
    return _trainers.step_of(_trainers.syncing(engine if engine is not None else EngineRecord()))


def engine_of(llm: Any) -> EngineRecord:
    """The guard's record of an instrumented vLLM engine (held by its generate hook)."""
    seen, todo = set(), [vars(llm)["generate"]]
    while todo:
        fn = todo.pop()
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        for cell in getattr(fn, "__closure__", None) or ():
            value = cell.cell_contents
            if isinstance(value, EngineRecord):
                return value
            if callable(value):
                todo.append(getattr(value, "func", value))
                todo.extend(a for a in getattr(value, "args", ()) if isinstance(a, EngineRecord) or callable(a))
    raise AssertionError("the guard's engine record was not found")


@contextmanager
def ledger_kept() -> Iterator[Ledger]:
    """Alarms fired inside are taken off the process's ledger after (the cell's counts, see
    tests/conftest.py, hold only what GRPO runs raised)."""
    before = len(LEDGER.alarms)
    try:
        yield LEDGER
    finally:
        with LEDGER.lock:
            del LEDGER.alarms[before:]
