"""reward-model-zero3: a reward model (AutoModelForSequenceClassification) under real DeepSpeed ZeRO-3.

* Every cell: the status matches the installed versions, and the probe, run directly on the real
  ``GRPOTrainer.__init__`` (no version window), agrees with the code it finds.
* 2 processes, ZeRO-3, gloo on the CPU (``tests/support/zero3_reward_worker.py``; about 30 s a launch), only
  at the ends of the window, TRL 0.14.x and 0.16.x with transformers < 4.52 (cells
  trl0.14.0-tf4.46.3, trl0.16.1-tf4.50.3): the reward model, a tiny Qwen2ForSequenceClassification
  whose pad id is 2, is passed as a directory and loaded partitioned by TRL. Without the patch
  the GRPO step dies with TRL's ``AssertionError: Padding_idx must be within num_embeddings``;
  with it the step trains, and every reward the model gave on each rank equals the same model's
  logits computed here, without ZeRO, on the same input ids.
"""

import importlib.util

import trl_compat
from trl_compat.patches import declared

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

PATCH = declared("reward-model-zero3")
PID = PATCH.id
PADDING_IDX = "AssertionError: Padding_idx must be within num_embeddings"

TRL, DS, TF = installed("trl"), installed("deepspeed"), installed("transformers")
HAVE_TRL = TRL is not None and importlib.util.find_spec("trl") is not None
HAVE_DS = DS is not None and importlib.util.find_spec("deepspeed") is not None
IN_WINDOW = HAVE_TRL and Version("0.14.0") <= TRL < Version("0.17.0")
AFFECTED = IN_WINDOW and HAVE_DS
# The 2-process runs cost ~1 min a cell: the window's oldest and newest TRL are enough.
TWO_PROCESS_CELL = AFFECTED and TRL.release[:2] in {(0, 14), (0, 16)} and TF < Version("4.52.0")

needs_trl = pytest.mark.skipif(not HAVE_TRL, reason="needs trl")
two_process = pytest.mark.skipif(
    not TWO_PROCESS_CELL, reason="2-process ZeRO-3 reward-model runs: trl 0.14.x / 0.16.x with deepspeed and transformers < 4.52 only"
)


@needs_trl
def test_probe_agrees_with_the_real_code():
    import trl.trainer.grpo_trainer as module

    verdict = PATCH.probe(module)  # reads through the wrapper to TRL's __init__
    assert verdict.needed is IN_WINDOW, verdict
    if IN_WINDOW:
        assert "accelerator.prepare_model only" in verdict.reason, verdict


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    import tiny

    root = tmp_path_factory.mktemp("reward_zero3")
    return tiny.save_tiny(root / "policy", "qwen2"), tiny.save_tiny_reward(root / "reward")


def launch(model_dirs, out_dir, disable=""):
    return launch_two("zero3_reward_worker.py", *model_dirs, out_dir, marker="Z3|", disable=disable)


def check_loaded_partitioned(run, patched):
    for event in run.per_rank("reward_model"):
        assert event["bare"] == event["type"] == "Qwen2ForSequenceClassification", event
        assert event["padding_idx"] == 2, event
        assert event["local_numel"] < event["full_numel"], event  # TRL loaded it inside zero.Init
        assert event["engines"] == (1 if patched else 0), event


@two_process
def test_reward_model_fails_under_zero3_without_patch(model_dirs, tmp_path):
    run = launch(model_dirs, tmp_path / "out", disable=PID)
    for event in run.per_rank("versions"):
        assert event["status"] == trl_compat.DISABLED, event
    check_loaded_partitioned(run, patched=False)
    for event in run.per_rank("reward_model"):
        assert event["local_numel"] == 0, event  # no weight at all on either rank
    assert run.returncode != 0, run.tail()
    assert PADDING_IDX in run.rest, run.tail()
    assert not run.of("reward_forward") and not run.of("train"), run.tail()


@two_process
def test_reward_model_scores_equal_a_plain_model_under_zero3(model_dirs, tmp_path):
    import torch
    from transformers import AutoModelForSequenceClassification

    run = launch(model_dirs, tmp_path / "out")
    assert run.returncode == 0, run.tail()
    for event in run.per_rank("versions"):
        assert event["status"] == trl_compat.APPLIED, event
    check_loaded_partitioned(run, patched=True)
    for event in run.per_rank("train"):
        assert event["steps"] == 1 and event["finite"], event

    forwards = run.of("reward_forward")
    assert sorted({e["rank"] for e in forwards}) == [0, 1], run.tail()
    reference = AutoModelForSequenceClassification.from_pretrained(model_dirs[1], num_labels=1).eval()
    assert reference.get_input_embeddings().padding_idx == 2
    for event in forwards:
        ids = torch.tensor(event["input_ids"])
        mask = torch.tensor(event["attention_mask"])
        # per_device_train_batch_size=2: prompts per device on 0.14 (x 2 generations), completions from 0.15
        assert ids.shape[0] == (4 if TRL.release[:2] == (0, 14) else 2), event
        with torch.no_grad():
            expected = reference(input_ids=ids, attention_mask=mask).logits
        got = torch.tensor(event["logits"])
        assert got.shape == expected.shape == (ids.shape[0], 1)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        assert len(set(got[:, 0].tolist())) > 1  # a real model's scores, not a constant
