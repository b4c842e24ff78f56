"""One run: what the guard keeps per adopted GRPO trainer (floor 1).

A :class:`Run` owns its trainer's pending completions, the step it is at (the trainer's own
``state.global_step``, read when asked), its ``offpolicy/*`` figures until the next log, check L's
open batches, streak and decided values, check S's seen generate calls and the trainer's log-prob
function. Runs are held weakly by their trainer: a run's state dies with its trainer, and two
trainers in one process (a notebook, a test session) never share any of it.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from trl_compat.guard._ledger import LEDGER, Alarm
from trl_compat.guard._records import Batch, Pending


def global_step(trainer: Any | None) -> int:
    state = getattr(trainer, "state", None)
    step = getattr(state, "global_step", None)
    return int(step) if isinstance(step, int) else 0


class Run:
    """The guard's state for one trainer."""

    def __init__(self, trainer: Any) -> None:
        self._trainer = weakref.ref(trainer)
        self.lock = threading.Lock()
        self.pending = Pending()
        self.figures: dict[str, list[float]] = {}  # metric name -> values since the last log
        self.generations = 0  # guarded generate calls made for this run
        self.open_batches: dict[int, Batch] = {}  # L: call number -> batch not yet decided
        self.streak = 0  # L: consecutive decided batches with D > τ
        self.decided: list[float] = []  # L: the D of each decided batch, oldest first
        self.seen_calls: set[int] = set()  # S: generate calls whose temperature was checked
        self.caller: Any = None  # the trainer's log-prob function (``_helpers.logps_calls.find``)

    @property
    def trainer(self) -> Any | None:
        return self._trainer()

    @property
    def step(self) -> int:
        """The optimizer step the run is at now."""
        return global_step(self._trainer())

    def add(self, name: str, value: float) -> None:
        with self.lock:
            self.figures.setdefault(name, []).append(float(value))

    def take_figures(self) -> dict[str, list[float]]:
        with self.lock:
            taken, self.figures = self.figures, {}
        return taken

    def fire(self, alarm: Alarm) -> None:
        LEDGER.fire(alarm)
        self.add("alarm", 1.0)


_RUNS: weakref.WeakKeyDictionary[Any, Run] = weakref.WeakKeyDictionary()
_RUNS_LOCK = threading.Lock()


def run_of(trainer: Any) -> Run:
    """``trainer``'s run (made on first use)."""
    with _RUNS_LOCK:
        run = _RUNS.get(trainer)
        if run is None:
            run = _RUNS[trainer] = Run(trainer)
        return run


def known_run(trainer: Any) -> Run | None:
    """``trainer``'s run if it has one (it was adopted), else None."""
    with _RUNS_LOCK:
        return _RUNS.get(trainer)


def fire(run: Run | None, alarm: Alarm) -> None:
    """Fire ``alarm`` for ``run``, or for no run (an engine no trainer drives: a server process)."""
    if run is not None:
        run.fire(alarm)
    else:
        LEDGER.fire(alarm)


def add(run: Run | None, name: str, value: float) -> None:
    if run is not None:
        run.add(name, value)
