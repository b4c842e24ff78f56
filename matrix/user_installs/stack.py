"""A user's stack in a fresh venv: ``pip install trl==X peft`` as resolved at a date, torch the
CPU wheel of the cells (pip's copy on this machine), nothing else; then trl_compat without its
dependencies (packaging, which every TRL requires already), so the row tests the user's stack."""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = pathlib.Path(__file__).resolve().parents[2]
TORCH = "torch==2.13.0"
NOW = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
FILTERED = re.compile(r"`([^`]+)` was filtered by `exclude-newer`")


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
    wheel = torch_wheel(cache)
    exempt: list[str] = []
    while True:
        dates = [arg for name in exempt for arg in ("--exclude-newer-package", f"{name}={NOW}")]
        out = run([tool, "pip", "install", "-q", "--exclude-newer", newest, *dates, wheel, f"trl=={trl}", "peft"], env=env)
        filtered = FILTERED.search(out.stderr)
        # the CPU torch wheel stands in for the torch of the date; a requirement of its own that the
        # date cannot meet (setuptools >= 77 before March 2025) is taken as of now, and the row says so
        if out.returncode == 0 or not filtered or filtered[1] in exempt or filtered[1] not in torch_requirements(wheel):
            break
        exempt.append(filtered[1])
    if out.returncode != 0:
        return {"error": "resolve: " + out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "resolve failed"}
    run([tool, "pip", "install", "-q", "--no-deps", ROOT], env=env, check=True)
    freeze = run([venv / "bin" / "python", "-c", FREEZE], check=True)
    return {"versions": json.loads(freeze.stdout), **({"exempt_from_date": exempt} if exempt else {})}


def torch_requirements(wheel: pathlib.Path) -> set[str]:
    """The names of the torch wheel's unconditional requirements (its METADATA)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        lines = archive.read(name).decode().splitlines()
    requirements = [Requirement(line.split(":", 1)[1]) for line in lines if line.startswith("Requires-Dist:")]
    return {canonicalize_name(r.name) for r in requirements if r.marker is None}


FREEZE = "import importlib.metadata as m, json; print(json.dumps({d.metadata['Name'].lower(): d.version for d in m.distributions()}))"
