"""A real ``trl vllm-serve`` process for a test: started under ``trl-compat run --``, waited for, stopped.

    server = VllmServer.start(model_dir, tmp_dir, extra_args=["--dtype", "float32"])
    server.wait_healthy(timeout=300)     # fails the test with the tail of the server's log
    ...                                  # http://127.0.0.1:{server.port}
    server.stop()                        # SIGKILL to its process group; asserts no process of it is
                                         # left and nothing listens on the port any more

``python -m trl_compat run -- trl vllm-serve --model DIR --host 127.0.0.1 --port P ...`` runs in its
own session (process group): the server forks an engine process (TRL >= 0.17) that a killed server
leaves behind, so ``stop`` kills the whole group. The ``trl`` console script is this interpreter's
(its directory first on ``PATH``). With ``record=True`` the test-only recorder in
``tests/support/serve_recorder`` is put on the server's ``PYTHONPATH`` (behind the launcher's
bootstrap, which runs it) and writes ``server.events()``: see its docstring.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence

import pytest

SUPPORT = pathlib.Path(__file__).resolve().parent
RECORDER = SUPPORT / "serve_recorder"
BIN = os.path.dirname(sys.executable)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(port: int) -> bool:
    """True if something still listens on 127.0.0.1:port (a bind with SO_REUSEADDR, as uvicorn's,
    fails only then: connections left in TIME_WAIT do not count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, read from /proc."""
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) ": state, ppid, pgrp, ...
        if int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


class VllmServer:
    def __init__(self, process: subprocess.Popen, port: int, log: pathlib.Path, events: pathlib.Path | None, model_dir=None):
        self.process, self.port, self.log, self.events_file = process, port, log, events
        self.model_dir = None if model_dir is None else str(model_dir)
        self.stopped = False

    @classmethod
    def start(
        cls,
        model_dir,
        tmp_dir,
        extra_args: Sequence[str] = (),
        record: bool = True,
        env: dict | None = None,
        command: Sequence[str] | None = None,
    ) -> VllmServer:
        """Start the server (``command`` replaces ``trl vllm-serve ...``: for testing this class)."""
        tmp_dir = pathlib.Path(tmp_dir)
        tmp_dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        environ = dict(os.environ, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONUNBUFFERED="1", CUDA_VISIBLE_DEVICES="")
        events = None
        if record:
            events = tmp_dir / "server-events.jsonl"
            events.write_text("")
            old = environ.get("PYTHONPATH")
            environ["PYTHONPATH"] = os.pathsep.join([*([old] if old else []), str(RECORDER)])
            environ["TRL_COMPAT_TEST_SERVE_LOG"] = str(events)
        environ.update(env or {})
        if command is None:
            command = ["trl", "vllm-serve", "--model", str(model_dir), "--host", "127.0.0.1", "--port", str(port), *extra_args]
        log = tmp_dir / "server.log"
        with open(log, "w") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "trl_compat", "run", "--", *command],
                env=environ,
                cwd=tmp_dir,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        return cls(process, port, log, events, model_dir)

    def tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health/", timeout=2) as response:
                return response.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float) -> float:
        """Seconds until ``/health/`` answered; fails the test (with the log's tail) if the server
        exits first or does not answer within ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                pytest.fail(f"trl vllm-serve exited ({self.process.returncode}) before /health/ answered:\n{self.tail()}")
            if self.healthy():
                return time.monotonic() - start
            time.sleep(1)
        pytest.fail(f"trl vllm-serve: /health/ did not answer within {timeout:.0f} s:\n{self.tail()}")

    def events(self, since: int = 0) -> list[dict]:
        """The recorder's events (from the ``since``-th on)."""
        lines = self.events_file.read_text().splitlines() if self.events_file else []
        return [json.loads(line) for line in lines[since:]]

    def stop(self) -> None:
        """SIGKILL to the server's process group (it does not exit on SIGTERM while its engine
        process runs); then no process of the group may be left and the port must be free."""
        if self.stopped:
            return
        self.stopped = True
        pgid = self.process.pid  # start_new_session: the server leads its own group
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 15
        while (group_members(pgid) or listening(self.port)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert group_members(pgid) == [], f"processes of the server's group left after SIGKILL: {group_members(pgid)}"
        assert not listening(self.port), f"port {self.port} still in use after the server was stopped"
