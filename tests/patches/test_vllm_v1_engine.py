"""vllm-v1-engine: TRL 0.14/0.15's in-process vLLM sync on vLLM >= 0.8 (V1 by default).

* Every cell: the TRL half of the probe on the real TRL source (0.14/0.15 build an in-process
  ``LLM`` and read ``llm_engine.model_executor``; 0.16/0.17 talk to a server; 0.18+'s colocate
  mode uses ``external_launcher``), and the status the installed versions call for.
* The trl0.15.2-tf4.52.4 cell (the vLLM stand-in installed as vLLM 0.8.5, which picks its V1 engine
  the way vLLM 0.8.x does on a GPU): real GRPO runs with TRL's real ``GRPOTrainer`` and
  ``use_vllm=True``. Without the patch TRL builds V1 and the first weight sync (after the first
  optimizer step) raises ``AttributeError: 'LLMEngine' object has no attribute 'model_executor'``;
  with it ``VLLM_USE_V1`` is "0" when TRL calls ``LLM(...)``, the engine is V0, the run completes
  and at every generation vLLM holds exactly the policy's weights.
* Cells with TRL 0.14/0.15 and the stand-in as vLLM 0.7.2 (V0 only: the gate says "not needed"):
  the patch's own ``apply`` on the real ``GRPOTrainer``: ``VLLM_USE_V1`` is "0" at the moment
  TRL's ``__init__`` calls ``LLM(...)``, unset without the patch, an explicit value is kept, and
  undoing the patch removes only its own "0".
* Where a real vLLM >= 0.8 is installed (not the stand-in): ``tests/support/vllm_v1_worker.py`` builds
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

import trl_compat
from trl_compat import _engine as engine
from trl_compat.patches import vllm_v1_engine

import pytest
from packaging.version import Version

from versions import installed
from workers import SUPPORT

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
STANDIN_V1 = STANDIN and VLLM >= Version("0.8.0")  # the stand-in as vLLM 0.8.5: V1 unless VLLM_USE_V1=0
V0_ENGINE = "vllm.engine.llm_engine.LLMEngine"
V1_ENGINE = "vllm.v1.engine.llm_engine.LLMEngine"
NO_EXECUTOR = "'LLMEngine' object has no attribute 'model_executor'"


def grpo_module():
    import trl.trainer.grpo_trainer as grpo

    return grpo


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_trl_half_of_the_probe_on_the_real_source():
    from trl_compat._helpers.source import code

    grpo = grpo_module()
    assert vllm_v1_engine.trl_reaches_model_executor(grpo) is TRL_IN_PROCESS
    source = code(grpo.GRPOTrainer)
    if TRL_IN_PROCESS:
        assert "self.llm.llm_engine.model_executor.driver_worker.model_runner.model" in source
    elif "llm_engine.model_executor" in source:  # 0.18/0.19 colocate: vLLM's external launcher
        assert "external_launcher" in source


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
    not (TRL_IN_PROCESS and STANDIN and not STANDIN_V1),
    reason="needs TRL 0.14/0.15 with the vLLM stand-in as vLLM 0.7.2 (where the gate keeps the patch off)",
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


# -- real GRPO runs on the stand-in as vLLM 0.8.5 (V1 by default) ------------------------------

needs_standin_v1 = pytest.mark.skipif(
    not (TRL_IN_PROCESS and STANDIN_V1),
    reason="needs TRL 0.14/0.15 with the vLLM stand-in as vLLM >= 0.8 (the trl0.15.2-tf4.52.4 cell)",
)

# TRL's default vllm_dtype ("auto"): vLLM runs the float32 checkpoint in float16, which V1 supports
# (grpo_run's vllm_dtype="float32" would make vLLM 0.8 fall back to V0 by itself)
V1_RUN = dict(use_vllm=True, steps=2, vllm_dtype="auto")


def engine_name(trainer):
    cls = type(trainer.llm.llm_engine)
    return f"{cls.__module__}.{cls.__qualname__}"


def vllm_holds_policy_weights(trainer):
    """Whether every weight vLLM holds equals the policy's, cast to vLLM's dtype."""
    import torch

    held = trainer.llm.model.hf_state_dict()
    policy = trainer.model.state_dict()
    assert set(held) <= set(policy), sorted(set(held) - set(policy))
    return all(torch.equal(held[name], policy[name].detach().to(held[name].dtype)) for name in held)


def watch_generations(trainer):
    """At each ``llm.generate`` TRL makes: whether vLLM then holds the policy's weights, and a copy
    of the policy's embeddings."""
    seen = []
    generate = trainer.llm.generate

    def watched(*args, **kwargs):
        seen.append(
            dict(in_sync=vllm_holds_policy_weights(trainer), embed=trainer.model.get_input_embeddings().weight.detach().clone())
        )
        return generate(*args, **kwargs)

    trainer.llm.generate = watched  # TRL calls self.llm.generate
    return seen


@needs_standin_v1
def test_grpo_without_the_patch_dies_at_the_first_weight_sync(tmp_path, constructions, unpatched):
    import grpo_run

    with unpatched(PATCH_ID):
        try:
            trainer = grpo_run.make_trainer(tmp_path, **V1_RUN)
            recorded = os.environ.get(VAR)
            seen = watch_generations(trainer)
            with pytest.raises(AttributeError) as info:
                trainer.train()
        finally:  # vLLM's record of its choice would make the patch's re-install on the way out "undecided"
            os.environ.pop(VAR, None)
    assert constructions == [None]  # vLLM chose
    assert engine_name(trainer) == V1_ENGINE and recorded == "1"  # V1, and vLLM recorded it
    assert type(info.value) is AttributeError and str(info.value) == NO_EXECUTOR
    # TRL's own weight sync, after the first optimizer step, before the second generation
    assert info.traceback[-1].path.name == "grpo_trainer.py"
    assert info.traceback[-1].name in {"_move_model_to_vllm", "_prepare_inputs"}  # 0.15 / 0.14
    assert trainer.state.global_step == 1 and len(seen) == 1 and seen[0]["in_sync"] is True


@needs_standin_v1
def test_grpo_with_the_patch_runs_on_v0_and_vllm_gets_the_trained_weights(tmp_path, constructions):
    import torch

    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    trainer = grpo_run.make_trainer(tmp_path, **V1_RUN)
    assert constructions == ["0"] and os.environ[VAR] == "0"  # set before TRL built the engine
    assert engine_name(trainer) == V0_ENGINE
    seen = watch_generations(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(seen) == 2
    # each generation ran on the policy's weights: the initial ones, then step 1's, brought by the sync
    assert [s["in_sync"] for s in seen] == [True, True]
    assert not torch.equal(seen[0]["embed"], seen[1]["embed"])
    if hasattr(trainer, "_move_model_to_vllm"):  # 0.15: one more sync, of the final weights
        trainer._move_model_to_vllm()
        assert vllm_holds_policy_weights(trainer)
        assert not torch.equal(seen[1]["embed"], trainer.model.get_input_embeddings().weight)


@needs_standin_v1
def test_v1_stand_in_an_explicit_v1_is_kept(tmp_path, constructions, monkeypatch):
    import grpo_run

    monkeypatch.setenv(VAR, "1")
    trainer = grpo_run.make_trainer(tmp_path, **V1_RUN)
    assert constructions == ["1"] and os.environ[VAR] == "1"
    assert engine_name(trainer) == V1_ENGINE  # the user's choice: TRL's sync will fail, as the report says


# -- a real vLLM >= 0.8 -------------------------------------------------------------------------


def run_worker(tmp_path, disable):
    env = {k: v for k, v in os.environ.items() if k != VAR}
    env.update(
        TRL_COMPAT_STRICT="0",
        TRL_COMPAT_DISABLE=disable,
        PYTHONUNBUFFERED="1",
        VLLM_CPU_KVCACHE_SPACE=env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
    )
    proc = subprocess.run(
        [sys.executable, os.path.join(SUPPORT, "vllm_v1_worker.py"), str(tmp_path)],
        env=env,
        cwd=SUPPORT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=900,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("V1|")]
    assert proc.returncode == 0 and lines, proc.stdout[-6000:]
    return json.loads(lines[-1][3:])


needs_real_vllm = pytest.mark.skipif(not (TRL_IN_PROCESS and REAL_VLLM_V1), reason="needs TRL 0.14/0.15 with a real vLLM >= 0.8")


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
