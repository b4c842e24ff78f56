"""``sitecustomize`` of ``trl-compat run``: found first on ``PYTHONPATH``, so Python's ``site``
imports it at the start of every interpreter started with the launcher's environment
(``accelerate launch``, torchrun and DeepSpeed ranks, ``trl`` CLI scripts, multiprocessing
spawn, subprocesses).

1. Runs the ``sitecustomize`` it shadows, if there is one (a distribution's or the user's),
   with this directory taken off ``sys.path`` while it is looked up (ddtrace-run's way).
2. Imports trl_compat, which imports neither torch, trl nor deepspeed: the patches wait on
   post-import hooks. The directory stays on ``PYTHONPATH`` so that children get it too.

Never raises: an interpreter that cannot import trl_compat says so on stderr and goes on.
Plain syntax, so that any Python 3 can read it.
"""

import os
import sys


def _norm(path):
    return os.path.normcase(os.path.realpath(path or os.curdir))


def _run_shadowed_sitecustomize():
    here = _norm(os.path.dirname(os.path.abspath(__file__)))
    positions = [i for i, entry in enumerate(sys.path) if _norm(entry) == here]
    if not positions:
        return
    entry = sys.path[positions[0]]
    ours = sys.modules.pop("sitecustomize", None)
    for i in reversed(positions):
        del sys.path[i]
    try:
        import importlib
        import importlib.util

        if importlib.util.find_spec("sitecustomize") is not None:
            importlib.import_module("sitecustomize")
    except Exception as err:  # noqa: BLE001 - what site.execsitecustomize does with a failing sitecustomize
        sys.stderr.write(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{err.__class__.__name__}: {err}\n")
    finally:
        if "sitecustomize" not in sys.modules and ours is not None:
            sys.modules["sitecustomize"] = ours
        # Put back where it was (ddtrace does the same): it no longer shadows anything, and
        # sys.path then matches PYTHONPATH, which children inherit unchanged.
        sys.path.insert(min(positions[0], len(sys.path)), entry)


def _activate():
    try:
        import trl_compat.activation
    except Exception as err:  # noqa: BLE001 - a broken trl_compat must not stop the interpreter
        sys.stderr.write(
            f"trl_compat: `trl-compat run` put its sitecustomize on PYTHONPATH, but {sys.executable} could not import "
            f"trl_compat ({err.__class__.__name__}: {err}); this process runs without its fixes\n"
        )
        return
    trl_compat.activation.activate(trl_compat.activation.LAUNCHER)


_run_shadowed_sitecustomize()
_activate()
