"""What the tests that launch workers share: where the workers are, and the events they print.

A worker prints one JSON object per event, each after a marker (``Z3|`` for the ZeRO-3 worker,
``F2|`` for the FSDP2 one), amid the launcher's and libraries' own output."""

import json
import os
import subprocess
import sys

SUPPORT = os.path.dirname(os.path.abspath(__file__))


def fresh_trainer_import(patch_id, disable=""):
    """``from trl import GRPOTrainer`` in a new interpreter with trl_compat imported first (``disable``:
    ``TRL_COMPAT_DISABLE``); it prints ``STATUS <patch_id's status>`` when the import succeeded."""
    env = dict(os.environ, TRL_COMPAT_DISABLE=disable)
    code = f"import trl_compat\nfrom trl import GRPOTrainer\nprint('STATUS', trl_compat.status({patch_id!r}))"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=300)


class Run:
    """One finished launch: its return code, its output and the events in it."""

    def __init__(self, returncode, output, marker):
        self.returncode, self.output = returncode, output
        self.events, rest = [], []  # rest: the output without the events (tracebacks, logs)
        decoder, i = json.JSONDecoder(), 0
        while True:
            start = output.find(marker, i)
            if start < 0:
                break
            rest.append(output[i:start])
            event, i = decoder.raw_decode(output, start + len(marker))
            self.events.append(event)
        self.rest = "".join(rest) + output[i:]

    def tail(self):
        return self.output[-6000:]

    def of(self, event, **match):
        return [e for e in self.events if e["event"] == event and all(e.get(k) == v for k, v in match.items())]

    def per_rank(self, event, **match):
        """The one event per rank (both ranks must have it)."""
        found = self.of(event, **match)
        by_rank = {e["rank"]: e for e in found}
        assert sorted(by_rank) == [0, 1] and len(found) == 2, (event, match, found, self.tail())
        return [by_rank[0], by_rank[1]]


def child_env(**overrides):
    """``os.environ`` for a child that runs a test file as a script and imports the helpers here."""
    env = dict(os.environ, **overrides)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [SUPPORT, os.environ.get("PYTHONPATH")]))
    return env


def two_process_launch(worker, *args, disable=""):
    """``(command, environment)`` of ``worker`` (a script here) in 2 processes under
    ``torch.distributed.run`` on the CPU (gloo; DeepSpeed's CPU accelerator), strict, with the
    patches in ``disable`` switched off."""
    env = dict(
        os.environ,
        TRL_COMPAT_STRICT="1",
        TRL_COMPAT_DISABLE=disable,
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
    )
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    return [*cmd, os.path.join(SUPPORT, worker), *map(str, args)], env


def launch_two(worker, *args, marker, disable="", timeout=420):
    """Run :func:`two_process_launch` to its end."""
    cmd, env = two_process_launch(worker, *args, disable=disable)
    proc = subprocess.run(cmd, env=env, cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return Run(proc.returncode, proc.stdout, marker)
