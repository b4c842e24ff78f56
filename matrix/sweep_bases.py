"""The base venvs the sweep swaps TRL releases into, one per transformers line, and the choice of base
for a release (its ``Requires-Dist`` on transformers)."""

import pathlib
import subprocess
import sys
import time

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
CELLS = ROOT / "matrix" / "cells"

V = Version


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def pins(cell, drop=("trl",)):
    lines = []
    for line in (CELLS / f"{cell}.txt").read_text().splitlines():
        line = line.strip()
        # a path line (./tests/vllm_standin/vX: the stand-in as a cell installs it) is not a pin: bases choose their own
        if line and not line.startswith(("#", "./")) and Requirement(line).name.lower() not in drop:
            lines.append(line)
    return lines


BASES = {
    # rich: a core requirement of trl 0.14-0.17 that the newer pins lack
    # the vLLM stand-in: the main-branch rows check the vLLM patches' probes, which need vllm installed
    "tf4.53": lambda: pins("trl0.19.1-tf4.53.3") + ["deepspeed==0.16.4", "rich", str(ROOT / "tests" / "vllm_standin" / "v0.9.1")],
    "tf4.57": lambda: [
        "torch==2.13.0",
        "transformers==4.57.6",
        "accelerate",
        "datasets",
        "peft",
        "deepspeed==0.19.8",
        # the vLLM stand-in as the vLLM TRL 0.24 pins: the vLLM patches' probes are judged too
        str(ROOT / "tests" / "vllm_standin" / "v0.10.2"),
        "pytest",
        "wrapt",
        "packaging",
        "rich",
    ],
    # requests: TRL 1.0 - 1.14's vllm_client imports it without declaring it; the vLLM stand-in as a
    # vLLM every 1.x release accepts, so that the 1.x rows judge the vLLM patches' probes (sleep mode)
    "tf5": lambda: pins("trl-newest") + ["rich", "requests", str(ROOT / "tests" / "vllm_standin" / "v0.17.0")],
}


_CURRENT = set()  # the bases this process put this tree's trl_compat into


def base_python(work, name):
    venv = work / f"base-{name}"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        t0 = time.time()
        run([sys.executable, "-m", "venv", "--clear", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", *BASES[name]()])
        (venv / ".ready").write_text(f"{time.time() - t0:.0f}s\n")
    if name not in _CURRENT:
        # a kept base holds the trl_compat of the sweep that built it: the tree's own, once per sweep
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)])
        _CURRENT.add(name)
    return python


def base_transformers(work, name):
    python = base_python(work, name)
    code = "import importlib.metadata as m; print(m.version('transformers'))"
    return V(run([str(python), "-c", code]).stdout.strip())


def choose_base(work, version, reqs):
    if version < V("0.20.0"):
        return "tf4.53"
    spec = next((r.specifier for r in reqs if r.name == "transformers"), None)
    # 0.x releases met transformers 4.x; 1.x releases came with transformers 5
    for name in ("tf4.57", "tf5") if version < V("1.0.0") else ("tf5", "tf4.57"):
        if spec is None or spec.contains(base_transformers(work, name), prereleases=True):
            return name
    return "tf4.57"
