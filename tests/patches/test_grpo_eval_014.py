"""grpo-eval-0.14: GRPO evaluation on TRL 0.14.0, on the CPU and under ZeRO-3 with 2 processes.

* Every cell: the status matches the installed versions, and the probe, run directly on the real
  ``trl.trainer.grpo_trainer`` (no version window), agrees with the code it finds.
* Cells with trl >= 0.15: an evaluation during training logs ``eval_loss`` and ``eval_reward``,
  the names the patch reproduces on 0.14.0.
* TRL 0.14.0 cells: without the patch ``evaluate()`` dies with ``'list' object has no attribute
  'get'``; with it, training with ``eval_strategy="steps"`` logs the GRPO metrics with the
  ``eval_`` prefix, computed from the evaluation completions only, and the training log keeps its
  own (values checked against the rewards the reward function returned).
* TRL 0.14.0 cells with deepspeed: one 2-process ZeRO-3 launch (``tests/support/zero3_eval_worker.py``,
  about 25 s): evaluation inside training (``eval_on_start``) works with grpo-eval-0.14 and
  zero3-unwrap together, and fails without either one.
"""

import functools
import importlib.metadata
import importlib.util
import json
import math
import os
import subprocess
import sys

import trl_compat
from trl_compat.patches import declared

import pytest
from packaging.version import Version

from versions import installed
from workers import SUPPORT

PATCH = declared("grpo-eval-0.14")
PID = PATCH.id
NO_GET = "'list' object has no attribute 'get'"
NO_OPTIMIZER = "AttributeError: 'Qwen2ForCausalLM' object has no attribute 'optimizer'"
GRPO_KEYS = ("loss", "reward", "reward_std", "kl", "completion_length", "rewards/varying_reward")

WORKER = os.path.join(SUPPORT, "zero3_eval_worker.py")


TRL, DS = installed("trl"), installed("deepspeed")
HAVE_TRL = TRL is not None and importlib.util.find_spec("trl") is not None
HAVE_DS = DS is not None and importlib.util.find_spec("deepspeed") is not None
# Expectations from versions; the patch itself probes the code.
TRL_014 = HAVE_TRL and Version("0.14.0") <= TRL < Version("0.15.0")

needs_trl = pytest.mark.skipif(not HAVE_TRL, reason="needs trl")
only_014 = pytest.mark.skipif(
    not TRL_014, reason="the bug is in trl 0.14.0 (cells trl0.14.0-tf4.46.3, trl0.14.0-tf4.52.4); fixed in 0.15.0"
)


@needs_trl
def test_probe_agrees_with_the_real_code(unpatched):
    import trl.trainer.grpo_trainer as module

    if TRL_014:
        with unpatched(PID):
            assert "prediction_step" not in vars(module.GRPOTrainer)
            verdict = PATCH.probe(module)
        assert verdict.needed is True, verdict
    else:
        verdict = PATCH.probe(module)
        assert verdict.needed is False and "defines its own prediction_step" in verdict.reason, verdict


def _trainer(tmp_path, eval_prompts=4, **overrides):
    import grpo_run

    return grpo_run.make_trainer(tmp_path, eval_dataset=grpo_run.tiny.prompt_dataset(eval_prompts), **overrides)


@only_014
def test_evaluate_raises_without_patch(tmp_path, unpatched):
    trainer = _trainer(tmp_path)
    with unpatched(PID):
        with pytest.raises(AttributeError) as error:
            trainer.evaluate()
    assert str(error.value) == NO_GET


@needs_trl
@pytest.mark.skipif(TRL_014, reason="on trl 0.14.0 the test below covers it, with the patch")
def test_later_releases_log_eval_loss_and_reward(tmp_path):
    """What the fix reproduces: TRL >= 0.15 logs eval_loss and eval_reward for an evaluation
    during training (TRL 0.16/0.17 prefix only those: a manual evaluate() logs "reward" there)."""
    trainer = _trainer(tmp_path, steps=1, eval_strategy="steps", eval_steps=1)
    trainer.train()
    (entry,) = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert math.isfinite(entry["eval_loss"]), entry
    assert math.isfinite(entry["eval_reward"]) and entry["eval_reward"] > 0, entry
    assert "reward" not in entry, entry


@only_014
def test_eval_during_training_reports_eval_metrics_apart_from_training(tmp_path):
    import torch

    import grpo_run

    calls = []  # (mode, mean reward) per reward-function call, in order
    holder = {}

    @functools.wraps(grpo_run.tiny.varying_reward)
    def varying_reward(prompts, completions, **kwargs):
        rewards = grpo_run.tiny.varying_reward(prompts, completions, **kwargs)
        mean = torch.tensor(rewards, dtype=torch.float32).mean().item()  # as TRL averages them
        calls.append(("train" if holder["trainer"].model.training else "eval", mean))
        return rewards

    # logging_steps=2: step 1's training metrics must wait for the step-2 log, past an evaluation.
    trainer = _trainer(tmp_path, steps=2, reward_funcs=[varying_reward], eval_strategy="steps", eval_steps=1, logging_steps=2)
    holder["trainer"] = trainer
    trainer.train()

    # 4 evaluation prompts, per_device_eval_batch_size 4: one evaluation batch per evaluation.
    assert [mode for mode, _ in calls] == ["train", "eval", "train", "eval"], calls
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    trains = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["step"] for e in evals] == [1, 2] and [e["step"] for e in trains] == [2], trainer.state.log_history

    for entry, (_, mean) in zip(evals, [c for c in calls if c[0] == "eval"]):
        for key in GRPO_KEYS:
            assert key not in entry, entry  # no training metric in the evaluation log
            assert math.isfinite(entry[f"eval_{key}"]), entry
        assert entry["eval_reward"] == pytest.approx(mean, rel=1e-6), (entry, calls)
        assert entry["eval_rewards/varying_reward"] == pytest.approx(mean, rel=1e-6)
        assert entry["eval_completion_length"] == 8.0  # max_completion_length: the random model never stops

    (train,) = trains
    assert not [k for k in train if k.startswith("eval_")], train
    train_means = [mean for mode, mean in calls if mode == "train"]
    # Both training steps, and nothing from the evaluations.
    assert train["reward"] == pytest.approx(sum(train_means) / 2, rel=1e-6), (train, calls)


# -- ZeRO-3, 2 processes --------------------------------------------------------------------------


def _events(output):
    events, decoder, i = [], json.JSONDecoder(), 0
    while True:
        start = output.find("Z3|", i)
        if start < 0:
            return events
        event, i = decoder.raw_decode(output, start + 3)
        events.append(event)


@only_014
@pytest.mark.skipif(not HAVE_DS, reason="needs deepspeed")
def test_zero3_two_processes_eval_needs_both_patches(tmp_path):
    import tiny

    model_dir = tiny.save_tiny(tmp_path / "tiny_qwen2", "qwen2")
    env = dict(os.environ)
    env.update(
        TRL_COMPAT_STRICT="1",
        TRL_COMPAT_DISABLE="",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        WORKER,
        str(model_dir),
        str(tmp_path / "out"),
    ]
    proc = subprocess.run(cmd, env=env, cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=420)
    tail = proc.stdout[-6000:]
    assert proc.returncode == 0, tail
    events = _events(proc.stdout)

    def per_rank(name, **match):
        found = [e for e in events if e["event"] == name and all(e.get(k) == v for k, v in match.items())]
        assert sorted(e["rank"] for e in found) == [0, 1], (name, match, found, tail)
        return sorted(found, key=lambda e: e["rank"])

    hooks_api = trl_compat.APPLIED if DS >= Version("0.16.4") else trl_compat.NOT_NEEDED
    for versions in per_rank("versions"):
        assert versions["statuses"] == {PID: trl_compat.APPLIED, "zero3-unwrap": trl_compat.APPLIED, "zero3-hooks-api": hooks_api}, (
            versions
        )

    # The evaluation at the start of training (eval_on_start), with both patches.
    evals = []
    for event in per_rank("in_training_eval"):
        assert event["step"] == 0 and event["engine"] == "DeepSpeedEngine" and event["bare"], event
        entry = event["entry"]
        assert math.isfinite(entry["eval_loss"]) and math.isfinite(entry["eval_reward"]), entry
        assert "reward" not in entry and "eval_kl" in entry, entry
        evals.append(entry)
    # Metrics are gathered over both ranks: the same numbers on each.
    assert {(e["eval_loss"], e["eval_reward"]) for e in evals} == {(evals[0]["eval_loss"], evals[0]["eval_reward"])}

    baseline = per_rank("in_training_eval")[0]["hooks"]
    assert baseline > 0
    for event in per_rank("without", patch="zero3-unwrap"):
        # Evaluation hands GRPO the bare module; 0.14.0's remove_hooks reads model.optimizer.
        assert event["error"] == NO_OPTIMIZER and event["hooks"] == baseline, event
        assert event["status"] == trl_compat.APPLIED, event
    for event in per_rank("without", patch=PID):
        assert event["error"] == f"AttributeError: {NO_GET}" and event["hooks"] == baseline, event
        assert event["status"] == trl_compat.APPLIED, event
    for event in per_rank("evaluated"):
        assert math.isfinite(event["metrics"]["eval_loss"]), event
        assert math.isfinite(event["last_log"]["eval_reward"]) and event["hooks"] == baseline, event
    for trained in per_rank("trained"):
        assert trained["steps"] == 1 and trained["observed"], trained
    per_rank("done")
