"""colocate-master-port: colocated vLLM fell back to MASTER_PORT 12345 (TRL 0.20 - 0.23).

* A real ``GRPOTrainer`` with ``use_vllm=True, vllm_mode="colocate"`` on the vLLM stand-in, built with
  ``MASTER_PORT`` unset while this test holds port 12345 (as a second run on the host would):
  unpatched, TRL sets ``MASTER_PORT=12345``, and the process group vLLM's ``external_launcher`` opens
  from those variables fails with EADDRINUSE (its TCP store, opened here as the launcher opens it);
  patched (and from 0.24.0), the port is a free one and the group opens.
* A port already set is kept either way; a run without vLLM is left alone.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import os
import socket

import pytest
from packaging.version import Version

from versions import installed

PID = "colocate-master-port"
TRL = installed("trl")
HELD = 12345

needs_colocate = pytest.mark.skipif(
    TRL is None or TRL < Version("0.20.0") or installed("vllm") is None,
    reason=f"TRL {TRL}: colocated vLLM sets MASTER_PORT from 0.20.0 (needs the stand-in)",
)
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.20.0") <= TRL < Version("0.24.0")) or installed("vllm") is None,
    reason=f"TRL {TRL}: the 12345 fallback is 0.20.0 - 0.23.x's (with the stand-in)",
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


@pytest.fixture
def held_port():
    """Port 12345 held, as another run's rendezvous would hold it (skip where something else has it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", HELD))
    except OSError:
        sock.close()
        pytest.skip(f"port {HELD} is taken on this host already")
    sock.listen(1)
    yield HELD
    sock.close()


def _colocated_trainer(tmp_path, **config):
    """GRPOTrainer(...) built directly (the test helper would give it a free port itself)."""
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    args, _ = grpo_run.make_config(tmp_path / "out", steps=1, use_vllm=True, **config)
    return GRPOTrainer(
        model=tiny.save_tiny(tmp_path / "tiny", "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=tiny.make_tokenizer(),
    )


def _rendezvous_error() -> str | None:
    """Open (and close) the rendezvous store vLLM's launcher opens from the variables TRL set: the TCP
    server on MASTER_ADDR:MASTER_PORT (a store of its own, so no process group of an earlier test
    in this session can stand in the way)."""
    import datetime

    import torch.distributed as dist

    try:
        store = dist.TCPStore(
            os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), 1, is_master=True, timeout=datetime.timedelta(seconds=20)
        )
    except Exception as exc:  # noqa: BLE001 - what the run would die of
        return f"{type(exc).__name__}: {exc}"
    del store
    return None


@needs_bug
def test_bug_without_the_patch_the_port_is_12345_and_taken(tmp_path, unpatched, held_port, monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    with unpatched(PID):
        _colocated_trainer(tmp_path)
    assert os.environ["MASTER_PORT"] == str(held_port)
    error = _rendezvous_error()
    assert error is not None and ("EADDRINUSE" in error or "address already in use" in error), error


@needs_colocate
def test_an_unset_port_becomes_a_free_one(tmp_path, held_port, monkeypatch):
    monkeypatch.delenv("MASTER_PORT", raising=False)
    _colocated_trainer(tmp_path)
    assert os.environ["MASTER_PORT"] != str(held_port)
    assert _rendezvous_error() is None


@needs_colocate
def test_a_port_set_is_kept(tmp_path, monkeypatch):
    from trl_compat.patches import colocate_master_port as patch

    port = str(patch.free_port())
    monkeypatch.setenv("MASTER_PORT", port)
    _colocated_trainer(tmp_path)
    assert os.environ["MASTER_PORT"] == port


@pytest.mark.skipif(TRL is None or TRL < Version("0.20.0"), reason="needs TRL >= 0.20")
def test_a_run_without_vllm_is_left_alone(tmp_path, monkeypatch):
    import grpo_run

    monkeypatch.delenv("MASTER_PORT", raising=False)
    grpo_run.make_trainer(tmp_path, steps=1)
    assert "MASTER_PORT" not in os.environ


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import colocate_master_port as patch

    import trl.trainer.grpo_trainer as module

    verdict = patch.probe(module)
    assert verdict.needed is (Version("0.20.0") <= TRL < Version("0.24.0")), verdict


class _Buggy:
    def __init__(self):
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "12345")


class _Fixed:
    def __init__(self):
        ensure_master_addr_port()  # noqa: F821


class _None:
    def __init__(self):
        self.llm = None


class _Other:
    def __init__(self):
        os.environ["MASTER_PORT"] = "29500"


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_None, False), (_Other, None)])
def test_probe_on_code_written_here(cls, needed):
    import types

    from trl_compat.patches import colocate_master_port as patch

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
