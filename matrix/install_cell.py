"""Install a tox env's packages with uv, torch from the CPU wheel pip finds: tox.ini's install_command.

A cell's install was pip's (40 - 100 s a cell, most of it unpacking torch and its neighbours again);
uv links what its cache holds instead (about 10 s). uv does not read pip's configuration, so the
torch wheel pip would take (``torch==2.13.0``, the CPU build on the machines the matrix runs on) is
fetched once with pip into ``<tox work dir>/wheels`` and handed to uv with ``--find-links``; the
rest comes from the index, pinned by the cell's file as before. Without uv on PATH (a plain
``pip install tox``), pip installs as it always did.

usage (by tox): python -I matrix/install_cell.py TOX_WORK_DIR [pip install options and packages]
"""

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

TORCH = "torch==2.13.0"


def pip_install(args):
    return [sys.executable, "-I", "-m", "pip", "install", "--no-compile", *args]


def torch_wheels(work: Path) -> Path:
    """``work/wheels`` with the torch wheel pip resolves for ``TORCH`` (downloaded once per tox work
    dir, under a lock: the matrix installs two envs at a time)."""
    wheels = work / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    with open(wheels / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not any(wheels.glob("torch-2.13.0*.whl")):
            subprocess.run([sys.executable, "-I", "-m", "pip", "download", "-q", "--no-deps", TORCH, "-d", str(wheels)], check=True)
    return wheels


def main(argv):
    work, args = Path(argv[1]), argv[2:]
    uv = shutil.which("uv")
    if uv is None:
        os.execv(sys.executable, pip_install(args))
    command = [uv, "pip", "install", "--python", sys.executable, "--find-links", str(torch_wheels(work)), *args]
    os.execv(uv, command)


if __name__ == "__main__":
    main(sys.argv)
