"""``trl-compat run -- CMD [ARGS...]``: run CMD with trl_compat active in it and in every Python
process it starts on this node.

CMD replaces this process (``os.execvpe``), with the bootstrap directory (whose
``sitecustomize`` imports trl_compat) put first on ``PYTHONPATH``; the user's entries follow
unchanged, empty ones (the working directory) included. Unlike opentelemetry-instrument, the
entry is never taken off again: ``accelerate launch``, torchrun, DeepSpeed and multiprocessing
children must inherit it. DeepSpeed's multi-node runner exports ``PYTHON*`` variables to the
other nodes, so ``PYTHONPATH`` reaches them too (the same path must exist there).
"""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Mapping, Sequence

from trl_compat.activation import BOOTSTRAP_DIR, is_bootstrap_dir


def child_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """``environ`` (default: ``os.environ``) with the bootstrap directory first on ``PYTHONPATH``."""
    env = dict(os.environ if environ is None else environ)
    old = env.get("PYTHONPATH")
    entries: list[str] = old.split(os.pathsep) if old else []
    # Already there (a nested `trl-compat run`, maybe of another copy)? Ours goes to the
    # front, so no other sitecustomize on PYTHONPATH shadows it; the rest stays as it was.
    kept = [e for e in entries if not is_bootstrap_dir(e)]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR] + kept)
    return env


def run(command: Sequence[str]) -> int:
    """Replace this process with ``command``; returns only if that fails (127: not found, 126: not executable)."""
    command = list(command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        sys.stderr.write("trl-compat run: no command given (usage: trl-compat run -- CMD [ARGS...])\n")
        return 2
    env = child_environment()
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as err:
        sys.stderr.write(f"trl-compat run: cannot run {command[0]!r}: {err.strerror or err}\n")
        return 127 if err.errno == errno.ENOENT else 126
    return 0  # pragma: no cover - execvpe does not return
