"""vllm-sleep-mode-weights (TRL 0.25+, colocate + vllm_enable_sleep_mode): vLLM must generate from
the weights of the last sync, not from the checkpoint reloaded from disk (or level-2 garbage).

* Real GRPO runs (3 train steps, then two ``evaluate()`` calls at the same step) on the vLLM
  stand-in, whose level-2 sleep overwrites the weights with garbage and whose
  ``collective_rpc("reload_weights")`` reloads the checkpoint: at every vLLM generate/chat call the
  weights the engine holds (``llm.model.hf_state_dict()``) are compared by value with the
  trainer's weights at the last sync.
  - unpatched 0.28+: every generation after step 0 runs on the initial checkpoint;
  - unpatched 0.26 - 0.27: the generation at an unchanged step (the second evaluate) does;
  - patched: every generation runs on the last synced weights, the trained ones after step 0.
  - TRL >= 1.10.0 (fixed by PR #5313, ``_llm_weights_sleeping``; the patch is not needed, so the
    three tests above skip there): the same run, unpatched by construction, generates from the
    last synced weights every time, as the patched older releases do.
* The state machine on a bare stand-in engine; the probe on the real TRL and on code written here.
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

PID = "vllm-sleep-mode-weights"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import torch

    import grpo_run
    import tiny


def _trl_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    return grpo_run.trl_version()[:2]


FIXED = (1, 10)  # TRL 1.10.0: PR #5313's _llm_weights_sleeping syncs after every level-2 sleep


def _sleep_cell_or_skip():
    version = _trl_or_skip()
    if version < (0, 25):
        pytest.skip("TRL < 0.25 sleeps vLLM at level 1 (weights kept): no bug")
    if version >= FIXED:
        pytest.skip("TRL 1.10.0 fixed it (PR #5313: _llm_weights_sleeping): the patch is not needed")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    # in these cells the patch must be on: a switched-off patch fails here, it does not skip
    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    return version


def _engine(trainer):
    generation = getattr(trainer, "vllm_generation", None)
    return generation.llm if generation is not None else vars(trainer)["llm"]


def _as(weights, like):
    return {k: v.detach().to(like[k].dtype).float().clone() for k, v in weights.items() if k in like}


def _same(a, b) -> bool:
    keys = a.keys() & b.keys()
    assert keys, "no weight names in common"
    return all(torch.equal(a[k], b[k]) for k in keys)


def _instrument(trainer):
    """Record, at each vLLM generate/chat call: the step, the engine's weights and the trainer's
    weights at the last sync (all float32 copies, trainer weights rounded to vLLM's dtype)."""
    llm = _engine(trainer)
    reference = llm.model.hf_state_dict()
    record = {"synced": None, "calls": [], "depth": 0}

    def snapshot_trainer():
        return _as(trainer.model.state_dict(), reference)

    owner = getattr(trainer, "vllm_generation", None)
    name = "sync_weights" if owner is not None else "_move_model_to_vllm"
    owner = owner if owner is not None else trainer
    sync = getattr(owner, name)

    def spy_sync(*args, **kwargs):
        out = sync(*args, **kwargs)
        record["synced"] = snapshot_trainer()
        return out

    setattr(owner, name, spy_sync)

    for method in ("generate", "chat"):
        original = getattr(llm, method)

        def spy(*args, _original=original, **kwargs):
            if record["depth"] == 0:
                engine = {k: v.detach().float().clone() for k, v in llm.model.hf_state_dict().items()}
                record["calls"].append((trainer.state.global_step, engine, record["synced"]))
            record["depth"] += 1
            try:
                return _original(*args, **kwargs)
            finally:
                record["depth"] -= 1

        setattr(llm, method, spy)
    record["initial"] = snapshot_trainer()
    return record


def _run(tmp_path):
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
    assert trainer.args.vllm_enable_sleep_mode and trainer.args.vllm_mode == "colocate"
    record = _instrument(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    eval_dataset = tiny.prompt_dataset(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)
    trainer.evaluate(eval_dataset=eval_dataset)
    trainer.evaluate(eval_dataset=eval_dataset)  # same global_step: TRL's own step test does not sync
    calls = record["calls"]
    steps = [step for step, _, _ in calls]
    assert steps[:3] == [0, 1, 2] and len(steps) >= 5 and set(steps[3:]) == {3}, steps  # eval: one call per batch
    assert all(synced is not None for _, _, synced in calls)
    assert not _same(calls[-1][2], record["initial"])  # training changed the weights
    return trainer, record


def test_bug_reproduced_without_the_patch(tmp_path, unpatched):
    version = _sleep_cell_or_skip()
    with unpatched(PID):
        _, record = _run(tmp_path)
    calls, initial = record["calls"], record["initial"]
    if version >= (0, 28):
        # sync_weights, then generate's wake + reload_weights: the checkpoint, every time after step 0
        for step, engine, synced in calls[1:]:
            assert _same(engine, initial), f"step {step}: vLLM does not hold the checkpoint"
            assert not _same(engine, synced), f"step {step}: vLLM holds the synced weights"
    else:
        # wake + reload, then a sync only on a new step: every later generation at the same step
        # (the next eval batches, the second evaluate) runs on the checkpoint
        previous, stale = None, 0
        for step, engine, synced in calls:
            if step != previous:
                assert _same(engine, synced), f"step {step}: the first generation of a step follows a sync"
            else:
                assert _same(engine, initial) and not _same(engine, synced), f"step {step}: not the checkpoint"
                stale += 1
            previous = step
        assert stale >= 2  # at least the second evaluate's


def test_patched_generates_from_the_last_synced_weights(tmp_path):
    _sleep_cell_or_skip()
    trainer, record = _run(tmp_path)
    calls, initial = record["calls"], record["initial"]
    for step, engine, synced in calls:
        assert _same(engine, synced), f"step {step}: vLLM does not hold the weights of the last sync"
    for step, engine, _ in calls[1:]:
        assert not _same(engine, initial), f"step {step}: vLLM holds the checkpoint"
    # the engine was put back to sleep after the last generation, with a sync due
    assert trainer._last_loaded_step == -1


def test_fixed_release_generates_from_the_last_synced_weights(tmp_path):
    """TRL >= 1.10.0, no patch (its probe says "not needed"): the instrumented run of the patched
    test gives the same values, every generation on the weights of the last sync, the trained
    ones after step 0, though the stand-in's level-2 sleep leaves garbage in the engine."""
    version = _trl_or_skip()
    if version < FIXED:
        pytest.skip("TRL < 1.10.0 has the bug: the tests above cover it")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    assert trl_compat.status(PID) == trl_compat.NOT_NEEDED, trl_compat.report()
    trainer, record = _run(tmp_path)
    calls, initial = record["calls"], record["initial"]
    for step, engine, synced in calls:
        assert _same(engine, synced), f"step {step}: vLLM does not hold the weights of the last sync"
    for step, engine, _ in calls[1:]:
        assert not _same(engine, initial), f"step {step}: vLLM holds the checkpoint"
    # TRL's own state: the engine went back to level-2 sleep after the last generation, a sync due
    assert trainer.vllm_generation._llm_weights_sleeping is True


def test_state_machine_on_a_bare_engine(tmp_path):
    """sleep(2) invalidates and forces a sync; the wake reloads once; TRL's reload after a sync is
    a no-op; level 1 keeps the weights; an unregistered engine is left alone."""
    _sleep_cell_or_skip()
    from trl_compat.patches import vllm_sleep_mode_weights as patch

    from vllm import LLM

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    llm = LLM(model=path, gpu_memory_utilization=0.5, dtype="float32", enable_sleep_mode=True)
    other = LLM(model=path, gpu_memory_utilization=0.5, dtype="float32", enable_sleep_mode=True)

    class Trainer:  # what the state machine touches of a trainer
        _last_loaded_step = 5

    trainer = Trainer()
    patch._STATES[llm] = patch._State(trainer)
    patch._STATES[llm].asleep, patch._STATES[llm].loaded = False, True

    def reloads(engine):
        return sum(1 for call in engine.engine_calls if call == ("collective_rpc", "reload_weights"))

    llm.sleep(level=1)
    assert trainer._last_loaded_step == 5
    llm.wake_up(tags=["weights"])
    assert reloads(llm) == 0
    llm.sleep(level=2)
    assert trainer._last_loaded_step == -1
    llm.wake_up(tags=["weights"])
    assert reloads(llm) == 1
    llm.collective_rpc("reload_weights")  # TRL's own reload: the weights are loaded already
    assert reloads(llm) == 1
    assert _same(llm.model.hf_state_dict(), tiny.make_model("qwen2").state_dict())  # buffers and all restored

    other.sleep(level=2)
    other.wake_up(tags=["weights"])
    assert reloads(other) == 0
    other.collective_rpc("reload_weights")
    assert reloads(other) == 1


def test_probe_on_the_installed_trl():
    version = _trl_or_skip()
    from trl_compat.patches import vllm_sleep_mode_weights as patch

    from trl.trainer import grpo_trainer

    kind, _ = patch.variant(grpo_trainer)
    verdict = patch.probe(grpo_trainer)
    # 1.0.0 - 1.9.2 carry 0.28's code; 1.10.0 has PR #5313's _llm_weights_sleeping
    releases = (((1, 10), None), ((0, 28), "0.28"), ((0, 26), "0.26"), ((0, 25), "0.25"))
    expected = next((kind for since, kind in releases if version >= since), None)
    assert kind == expected
    assert verdict.needed is (expected is not None)


@pytest.mark.parametrize(
    "body, verdict",
    [
        # 0.25.x: level 2, wake without reload, step-gated sync
        (
            "def _generate_single_turn(self, prompts):\n"
            "        self.llm.wake_up(tags=['weights'])\n"
            "        if self.state.global_step != self._last_loaded_step:\n            self._move_model_to_vllm()\n"
            "        self.llm.sleep(level=2)\n",
            True,
        ),
        # 0.26 - 0.27: reload before the step test
        (
            "def _generate_single_turn(self, prompts):\n"
            "        self.llm.wake_up(tags=['weights'])\n        self.llm.collective_rpc('reload_weights')\n"
            "        if self.state.global_step != self._last_loaded_step:\n            self._move_model_to_vllm()\n"
            "        self.llm.sleep(level=2)\n",
            True,
        ),
        # PR #5313's flag
        (
            "def _generate_single_turn(self, prompts):\n"
            "        if self._llm_weights_sleeping:\n            self.llm.wake_up(tags=['weights'])\n"
            "        self.llm.sleep(level=2)\n",
            False,
        ),
        # 0.23 - 0.24: level 1
        ("def _generate_single_turn(self, prompts):\n        self.llm.wake_up()\n        self.llm.sleep(level=1)\n", False),
        # level 2 in a shape the probe does not know
        ("def _generate_single_turn(self, prompts):\n        self.llm.sleep(level=2)\n", None),
    ],
)
def test_probe_reads_the_module_source(code_module, body, verdict):
    _trl_or_skip()

    from trl_compat.patches import vllm_sleep_mode_weights as patch

    module = code_module(f"class GRPOTrainer:\n    {body}")
    assert patch.probe(module).needed is verdict
