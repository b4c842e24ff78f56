"""vllm-v1-engine: TRL 0.14/0.15's in-process vLLM sync on vLLM >= 0.8 (V1 by default).

* Every cell: the TRL half of the probe on the real TRL source (0.14/0.15 build an in-process
  ``LLM`` and read ``llm_engine.model_executor``; 0.16/0.17 talk to a server; 0.18+'s colocate
  mode uses ``external_launcher``), and the status the installed versions call for.
* Cells with TRL 0.14/0.15 and the vLLM stand-in (0.7.2, V0 only: the gate says "not needed"):
  the patch's own ``apply`` on the real ``GRPOTrainer``: ``VLLM_USE_V1`` is "0" at the moment
  TRL's ``__init__`` calls ``LLM(...)``, unset without the patch, an explicit value is kept, and
  undoing the patch removes only its own "0".
* Where a real vLLM >= 0.8 is installed (not the stand-in): ``tests/vllm_v1_worker.py`` builds
  TRL's real engine in a fresh process, with and without the patch, and runs TRL's real
  ``_move_model_to_vllm``: with the patch the engine is V0 and vLLM holds the trained weights;
  without it, where vLLM picks V1, TRL dies with ``AttributeError: 'LLMEngine' object has no
  attribute 'model_executor'`` (vLLM 0.8's CPU build falls back to V0 by itself: skipped there).
"""

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from packaging.version import Version

import trl_compat
from trl_compat import _engine as engine
from trl_compat.patches import vllm_v1_engine
from versions import installed

HERE = os.path.dirname(os.path.abspath(__file__))
PATCH_ID = "vllm-v1-engine"
VAR = "VLLM_USE_V1"

TRL, VLLM = installed("trl"), installed("vllm")
TRL_IN_PROCESS = TRL is not None and Version("0.14.0") <= TRL < Version("0.16.0")


def _is_standin():
    if VLLM is None or importlib.util.find_spec("vllm") is None:
        return False
    import vllm

    return bool(getattr(vllm, "__stand_in__", False))


STANDIN = _is_standin()
REAL_VLLM_V1 = VLLM is not None and not STANDIN and VLLM >= Version("0.8.0")


def grpo_module():
    import trl.trainer.grpo_trainer as grpo

    return grpo


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_trl_half_of_the_probe_on_the_real_source():
    from trl_compat._source import code

    grpo = grpo_module()
    assert vllm_v1_engine.trl_reaches_model_executor(grpo) is TRL_IN_PROCESS
    source = code(grpo.GRPOTrainer)
    if TRL_IN_PROCESS:
        assert "self.llm.llm_engine.model_executor.driver_worker.model_runner.model" in source
    elif "llm_engine.model_executor" in source:  # 0.18/0.19 colocate: vLLM's external launcher
        assert "external_launcher" in source


@pytest.mark.skipif(REAL_VLLM_V1, reason="with a real vLLM >= 0.8 the status depends on VLLM_USE_V1: see below")
def test_status_matches_installed_versions():
    if TRL is not None and importlib.util.find_spec("trl") is not None:
        grpo_module()
    assert trl_compat.status(PATCH_ID) == trl_compat.NOT_NEEDED, trl_compat.report()
    reason = {p.id: p.reason for p in trl_compat.report()}[PATCH_ID]
    if TRL is None:
        assert "trl is not installed" in reason
    elif not TRL_IN_PROCESS:
        assert f"trl {TRL} is outside" in reason, reason
    elif VLLM is None:
        assert "vllm is not installed" in reason, reason
    else:  # the stand-in: vLLM 0.7.x, V0 only
        assert f"vllm {VLLM} is outside the affected window >=0.8.0.dev0" in reason, reason


# -- the patch's apply on the real GRPOTrainer, with the stand-in's LLM -------------------------


@pytest.fixture
def constructions(monkeypatch):
    """``VLLM_USE_V1`` as it is each time TRL's ``__init__`` calls ``LLM(...)``."""
    grpo = grpo_module()
    seen = []

    class ObservedLLM(grpo.LLM):
        def __init__(self, *args, **kwargs):
            seen.append(os.environ.get(VAR))
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(grpo, "LLM", ObservedLLM)  # TRL calls the module global
    monkeypatch.delenv(VAR, raising=False)
    return seen


@pytest.fixture
def patch_applied():
    """The patch's own apply on the real GRPOTrainer (the gate keeps it off on vLLM 0.7)."""
    patcher = engine.Patcher(PATCH_ID)
    vllm_v1_engine.apply(grpo_module(), patcher)
    yield patcher
    patcher.undo()


needs_standin_trainer = pytest.mark.skipif(
    not (TRL_IN_PROCESS and STANDIN), reason="needs TRL 0.14/0.15 with the vLLM stand-in"
)


@needs_standin_trainer
def test_apply_sets_the_default_before_trl_builds_its_engine(tmp_path, constructions, patch_applied):
    import grpo_run

    grpo_run.make_trainer(tmp_path / "plain")  # use_vllm=False: nothing to set
    assert constructions == [] and VAR not in os.environ
    trainer = grpo_run.make_trainer(tmp_path / "vllm", use_vllm=True)
    assert constructions == ["0"] and os.environ[VAR] == "0"  # before LLM(...), and kept for vLLM's later reads
    if hasattr(trainer, "_move_model_to_vllm"):  # 0.15 (0.14.0 syncs inline in compute_loss)
        trainer._move_model_to_vllm()  # TRL's V0 path still works
    assert trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model is not None
    patch_applied.undo()
    assert VAR not in os.environ  # the patch's own "0" goes with it


@needs_standin_trainer
def test_without_the_patch_vllm_chooses(tmp_path, constructions):
    import grpo_run

    grpo_run.make_trainer(tmp_path, use_vllm=True)
    assert constructions == [None]  # vLLM >= 0.8 would then build V1 where it can


@needs_standin_trainer
def test_an_explicit_choice_is_kept(tmp_path, constructions, monkeypatch):
    import grpo_run

    monkeypatch.setenv(VAR, "1")
    patcher = engine.Patcher(PATCH_ID)
    vllm_v1_engine.apply(grpo_module(), patcher)
    try:
        grpo_run.make_trainer(tmp_path, use_vllm=True)
        assert constructions == ["1"]
    finally:
        patcher.undo()
    assert os.environ[VAR] == "1"


# -- a real vLLM >= 0.8 -------------------------------------------------------------------------


def run_worker(tmp_path, disable):
    env = {k: v for k, v in os.environ.items() if k != VAR}
    env.update(TRL_COMPAT_STRICT="0", TRL_COMPAT_DISABLE=disable, PYTHONUNBUFFERED="1",
               VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "vllm_v1_worker.py"), str(tmp_path)],
                          env=env, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("V1|")]
    assert proc.returncode == 0 and lines, proc.stdout[-6000:]
    return json.loads(lines[-1][3:])


needs_real_vllm = pytest.mark.skipif(
    not (TRL_IN_PROCESS and REAL_VLLM_V1), reason="needs TRL 0.14/0.15 with a real vLLM >= 0.8"
)


@needs_real_vllm
def test_real_vllm_with_the_patch(tmp_path):
    out = run_worker(tmp_path, disable="")
    if VLLM >= Version("0.11.0"):  # no V0 left: nothing to select
        assert out["status"] == trl_compat.UNDECIDED and "not the V0 engine" in out["reason"], out
        return
    assert out["status"] == trl_compat.APPLIED, out
    assert out["env_at_construction"] == ["0"], out
    assert out["engine"] == "vllm.engine.llm_engine.LLMEngine", out  # V0
    assert out["sync_error"] is None, out
    assert out["vllm_holds_trained"] is True and out["vllm_held_initial"] is True, out


@needs_real_vllm
def test_real_vllm_without_the_patch(tmp_path):
    out = run_worker(tmp_path, disable=PATCH_ID)
    assert out["status"] == trl_compat.DISABLED and out["env_at_construction"] == [None], out
    if not out["engine"].startswith("vllm.v1."):
        pytest.skip(f"vLLM {VLLM} picked {out['engine']} by itself here (V1 unsupported on this platform)")
    assert out["sync_error"] == "AttributeError: 'LLMEngine' object has no attribute 'model_executor'", out
