"""vllm-serve-get-open-port: ``trl vllm-serve`` of TRL 0.17 - 0.27.2 imports ``get_open_port`` from
``vllm.utils``, which vLLM 0.14 no longer exports.

* Every cell with TRL: the probe's TRL half on the real ``trl/scripts/vllm_serve.py``, read without
  importing it.
* TRL in the window with vLLM >= 0.14 (the trl0.26.2-tf4.57.3 cell: the stand-in as vLLM 0.14.0):
  the real server process, ``trl-compat run -- trl vllm-serve --model <tiny local dir> --host
  127.0.0.1 --port <free>`` (bounded in time, killed at the end). With this patch switched off (and
  vllm-guided-decoding-import on, which the same file needs first on TRL <= 0.26.2) it dies with
  ``ImportError: cannot import name 'get_open_port' from 'vllm.utils'``; with it the module
  imports and ``trl.scripts.vllm_serve.main`` runs. How far it then gets depends on the cell: where
  FastAPI and uvicorn are installed (the trl0.26.2 cell pins them), the server comes up on the
  stand-in: its ``/health/`` endpoint answers and a ``/generate/`` request returns completions (TRL's
  ``SamplingParams(guided_decoding=None, ...)`` in the server process: vllm-guided-decoding-import
  at work there too); where they are not, ``main`` stops at its first check, ``ImportError: FastAPI
  is required to run the vLLM serve script``, which only a process past the import can reach.
"""

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import trl_compat
from trl_compat.patches import vllm_serve_get_open_port as patch_module

import pytest
from packaging.version import Version

pytest.importorskip("torch")  # grpo_run and tiny build torch models: not in the notrl cell

import tiny
from versions import installed
from workers import SUPPORT

PATCH_ID = "vllm-serve-get-open-port"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and Version("0.17.0") <= TRL < Version("0.28.0")
IN_CELL = IN_WINDOW and VLLM is not None and VLLM >= Version("0.14.0")
in_cell = pytest.mark.skipif(not IN_CELL, reason="TRL 0.17 - 0.27.2 with vLLM >= 0.14 only (the trl0.26.2-tf4.57.3 cell)")
BIN = os.path.dirname(sys.executable)
IMPORT_ERROR = "cannot import name 'get_open_port' from 'vllm.utils'"
NO_FASTAPI = "FastAPI is required to run the vLLM serve script"
SERVES = all(importlib.util.find_spec(name) is not None for name in ("fastapi", "uvicorn", "pydantic"))


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_probe_reads_the_import_line_of_vllm_serve():
    class Utils:  # a vllm.utils without the name
        pass

    verdict = patch_module.probe(Utils)
    assert verdict.needed is IN_WINDOW, verdict
    if IN_WINDOW:
        assert "imports get_open_port from vllm.utils" in verdict.reason

    class OldUtils:  # vLLM <= 0.13 still exports it
        get_open_port = staticmethod(lambda: 0)

    assert patch_module.probe(OldUtils).needed is False


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny.save_tiny(tmp_path_factory.mktemp("vllm_serve") / "tiny_qwen2", "qwen2")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(model_dir, tmp_path, disable=""):
    """``trl-compat run -- trl vllm-serve`` on 127.0.0.1; returns (process, port, log path)."""
    port = free_port()
    env = dict(os.environ, TRL_COMPAT_DISABLE=disable, PATH=BIN + os.pathsep + os.environ.get("PATH", ""), PYTHONUNBUFFERED="1")
    env.update(CUDA_VISIBLE_DEVICES="", HF_HOME=str(tmp_path / "hf_home"))
    log = tmp_path / "server.log"
    cmd = [sys.executable, "-m", "trl_compat", "run", "--", "trl", "vllm-serve", "--model", str(model_dir)]
    cmd += ["--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        # its own session: stop() kills the server and the engine processes it forks, all of them
        process = subprocess.Popen(cmd, env=env, cwd=SUPPORT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return process, port, log


def wait(process, port, timeout):
    """Until the process exits or (where it can serve) /health/ answers; returns whether it answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if SERVES:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/", timeout=2) as response:
                    return response.status == 200
            except OSError:
                pass
        time.sleep(1)
    return False


def post(port, path, body):
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def stop(process):
    """SIGKILL to the server's process group (its forked engine workers outlive a killed server,
    and it does not exit on SIGTERM while they run)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


@in_cell
def test_unpatched_server_dies_on_the_import(model_dir, tmp_path):
    process, port, log = start_server(model_dir, tmp_path, disable=PATCH_ID)
    try:
        assert not wait(process, port, timeout=240)
        assert process.poll() is not None, "still running after 240 s"
    finally:
        stop(process)
    text = log.read_text()
    assert process.returncode != 0
    assert IMPORT_ERROR in text, text[-3000:]


@in_cell
def test_patched_server_gets_past_the_import(model_dir, tmp_path):
    assert trl_compat.status(PATCH_ID) in (trl_compat.APPLIED, trl_compat.PENDING), trl_compat.report()
    process, port, log = start_server(model_dir, tmp_path)
    generated = None
    try:
        healthy = wait(process, port, timeout=240)
        if healthy:
            generated = post(port, "/generate/", {"prompts": ["hello world"], "max_tokens": 4})
    finally:
        stop(process)
    text = log.read_text()
    assert IMPORT_ERROR not in text and "GuidedDecodingParams" not in text, text[-3000:]
    if SERVES:
        assert healthy, text[-3000:]
        # TRL's /generate/ builds SamplingParams(guided_decoding=None, ...): vllm-guided-decoding-import
        # hands it to vLLM 0.14 as structured_outputs=, and the stand-in generates
        assert len(generated["completion_ids"]) == 1 and 1 <= len(generated["completion_ids"][0]) <= 4, generated
    else:
        # the first statement of trl.scripts.vllm_serve.main: only a process past the import gets there
        assert NO_FASTAPI in text and 'vllm_serve.py", line' in text and "in main" in text, text[-3000:]
