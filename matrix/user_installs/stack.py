"""A user's stack in a fresh venv: ``pip install trl==X peft`` as resolved at a date, torch the
CPU wheel of the cells (pip's copy on this machine), nothing else; then trl_compat without its
dependencies (packaging, which every TRL requires already), so the row tests the user's stack."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"


def run(cmd, **kwargs):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kwargs)


def uv() -> str:
    """The uv executable (installed into this interpreter's environment when missing)."""
    found = shutil.which("uv") or str(pathlib.Path(sys.executable).with_name("uv"))
    if not pathlib.Path(found).exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "uv"], check=True)
    return found


def torch_wheel(cache: pathlib.Path) -> pathlib.Path:
    """The torch wheel the cells install, as pip finds it (uv would take a CUDA build from PyPI)."""
    wheels = sorted(cache.glob("torch-2.13.0*.whl"))
    if not wheels:
        run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", TORCH, "-d", cache], check=True)
        wheels = sorted(cache.glob("torch-2.13.0*.whl"))
    return wheels[0]


def build(venv: pathlib.Path, trl: str, date: str, cache: pathlib.Path) -> dict:
    """Resolve the stack into ``venv``; returns the installed versions or the resolver's error."""
    shutil.rmtree(venv, ignore_errors=True)
    tool = uv()
    run([tool, "venv", "-q", "-p", sys.executable, venv], check=True)
    env = dict(os.environ, VIRTUAL_ENV=str(venv), UV_CACHE_DIR=str(cache / "uv"))
    # the day's end: every file uploaded on that day counts
    newest = f"{date}T23:59:59Z"
    out = run([tool, "pip", "install", "-q", "--exclude-newer", newest, torch_wheel(cache), f"trl=={trl}", "peft"], env=env)
    if out.returncode != 0:
        return {"error": "resolve: " + out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "resolve failed"}
    run([tool, "pip", "install", "-q", "--no-deps", ROOT], env=env, check=True)
    freeze = run([venv / "bin" / "python", "-c", FREEZE], check=True)
    return {"versions": json.loads(freeze.stdout)}


FREEZE = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
