"""What the benchmarks measure with, in one place: a call's peak extra memory, a child process's CPU time.

Imported by the benchmark scripts as ``import _measure`` (``python benchmarks/<name>.py`` puts
``benchmarks/`` first on ``sys.path``). Linux only: it reads ``/proc/self/status``.

Peak extra memory is the process's peak resident set size during a call (``VmHWM``, reset through
``/proc/self/clear_refs`` right before it) minus the resident size just before it. For that to see
every allocation, the measuring process should run with :data:`MALLOC_ENV`: glibc then gives
freed blocks of 64 KiB and more back at once, so memory freed by an earlier call does not sit in
the heap to be reused unseen by a later one.
"""

from __future__ import annotations

import gc
import os
import statistics
import subprocess
import time
from collections.abc import Sequence
from typing import Callable

# For the environment of a child process that measures memory (see the module docstring).
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}

# Left out of a timed child's environment: a search path or the switch would change what starts, and
# PYTHONDONTWRITEBYTECODE would make every run compile its modules from source (a user's `pip install`
# byte-compiles them; the warm-up runs write the .pyc files only where this is unset).
UNTIMED_ENV = ("PYTHONPATH", "TRL_COMPAT_AUTO", "PYTHONDONTWRITEBYTECODE")


def child_env() -> dict[str, str]:
    """This process's environment for a timed child, without :data:`UNTIMED_ENV`."""
    return {k: v for k, v in os.environ.items() if k not in UNTIMED_ENV}


def status_bytes(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``) in bytes."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_peak() -> None:
    """Reset ``VmHWM`` (peak RSS) to the current RSS."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_extra(fn: Callable[[], object]) -> tuple[object, int, float]:
    """``(result, peak extra bytes, wall seconds)`` of one call of ``fn``."""
    gc.collect()
    reset_peak()
    before = status_bytes("VmRSS")
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    return result, status_bytes("VmHWM") - before, seconds


def measure(fn: Callable[[], object], repeats: int, warmup: int = 1) -> tuple[dict[str, object], object]:
    """``fn`` ``warmup`` times unmeasured, then ``repeats`` times measured: ``({peak_bytes (highest),
    peak_bytes_all, seconds (median), seconds_all}, last result)``."""
    for _ in range(warmup):
        fn()
    peaks: list[int] = []
    times: list[float] = []
    result = None
    for _ in range(repeats):
        result, peak, seconds = peak_extra(fn)
        peaks.append(peak)
        times.append(seconds)
    return dict(peak_bytes=max(peaks), peak_bytes_all=peaks, seconds=statistics.median(times), seconds_all=times), result


def run_timed(cmd: Sequence[str], env: dict[str, str]) -> tuple[float, float]:
    """``(wall seconds, CPU seconds)`` of one child process, output discarded; it must exit 0.
    The CPU time (user + system, from ``wait4``) is what a loaded machine distorts least:
    waiting for a core is not counted."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(cmd), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{list(cmd)} exited with {proc.returncode}")
    return wall, usage.ru_utime + usage.ru_stime


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def mib(n: float) -> str:
    return f"{n / 2**20:,.0f}"
