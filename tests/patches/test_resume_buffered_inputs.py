"""resume-buffered-inputs: a TRL 0.16.x run with num_iterations=2 resumes from a mid-iteration checkpoint.

* Every cell: the status matches the installed TRL, and the probe, run directly on the real
  ``GRPOTrainer._prepare_inputs`` (no version window), agrees with the code it finds.
* TRL 0.16.x cells (trl0.16.1-tf4.50.3, trl0.16.1-tf4.52.4): a real 2-step GRPO run
  (tiny Qwen2, num_iterations=2) saves checkpoint-1 (global_step 1: mid-iteration). Resumed
  from it without the patch, ``train()`` dies at step 1 with TRL's TypeError on ``None`` inputs;
  with it, the resumed step trains on the prompts the uninterrupted run trained on at step 1
  (same ids, same padding mask, a full generation of the same shape) and ends at step 2 with a
  finite loss.
"""

import importlib.util
import math

from trl_compat.patches import declared

import pytest
from packaging.version import Version

from versions import installed

PATCH = declared("resume-buffered-inputs")
PID = PATCH.id
TRL = installed("trl")
HAVE_TRL = TRL is not None and importlib.util.find_spec("trl") is not None
AFFECTED = HAVE_TRL and Version("0.16.0") <= TRL < Version("0.17.0")
NONE_INPUTS = "'NoneType' object is not subscriptable"

needs_trl = pytest.mark.skipif(not HAVE_TRL, reason="needs trl")
affected_only = pytest.mark.skipif(not AFFECTED, reason="num_iterations buffering without a None check: trl 0.16.x")


@needs_trl
def test_probe_agrees_with_the_real_code(unpatched):
    import trl.trainer.grpo_trainer as module

    if AFFECTED:
        with unpatched(PID):
            verdict = PATCH.probe(module)
        assert verdict.needed is True and "never checking for None" in verdict.reason, verdict
        # the wrapper's source is not TRL's: the probe reads through functools.wraps to TRL's code
        assert PATCH.probe(module).needed is True
    else:
        verdict = PATCH.probe(module)
        assert verdict.needed is False, verdict


def _recording_trainer():
    from trl import GRPOTrainer

    class Recording(GRPOTrainer):
        seen = None

        def _prepare_inputs(self, inputs):
            out = super()._prepare_inputs(inputs)
            if self.model.training and self.seen is not None:
                self.seen.append((self.state.global_step, out))
            return out

    return Recording


def _run(tmp_path, seen, resume=None):
    import grpo_run

    cls = _recording_trainer()
    trainer = grpo_run.make_trainer(
        tmp_path,
        steps=2,
        trainer_cls=cls,
        num_iterations=2,
        save_strategy="steps",
        save_steps=1,
        train_dataset=grpo_run.tiny.prompt_dataset(8),
    )
    trainer.seen = seen
    trainer.train(resume_from_checkpoint=resume)
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The 2-step run, with the inputs of each step and its checkpoint-1 (global_step 1 of num_iterations 2)."""
    tmp = tmp_path_factory.mktemp("uninterrupted")
    seen = []
    trainer = _run(tmp, seen)
    assert trainer.num_iterations == 2 and trainer.state.global_step == 2
    assert [step for step, _ in seen] == [0, 1]
    checkpoint = tmp / "out" / "checkpoint-1"
    assert (checkpoint / "trainer_state.json").is_file()
    return seen, str(checkpoint)


@affected_only
def test_resume_mid_iteration_gets_none_inputs_without_patch(uninterrupted, tmp_path, unpatched):
    _, checkpoint = uninterrupted
    seen = []
    with unpatched(PID):
        with pytest.raises(TypeError) as error:
            _run(tmp_path, seen, resume=checkpoint)
    assert str(error.value) == NONE_INPUTS
    assert seen == [(1, None)]  # TRL handed None to the loss at the first resumed step


@affected_only
def test_resumed_step_trains_on_the_uninterrupted_runs_prompts(uninterrupted, tmp_path):
    import torch

    import grpo_run

    before, checkpoint = uninterrupted
    seen = []
    trainer = _run(tmp_path, seen, resume=checkpoint)
    assert trainer.state.global_step == 2
    assert [step for step, _ in seen] == [1], seen

    resumed, reference = seen[0][1], before[1][1]  # step 1 in both runs
    assert reference is before[0][1]  # uninterrupted: step 1 reused the buffered generation of step 0
    assert resumed is not None and set(resumed) == set(reference)
    assert torch.equal(resumed["prompt_ids"], reference["prompt_ids"])
    assert torch.equal(resumed["prompt_mask"], reference["prompt_mask"])
    assert resumed["completion_ids"].shape == reference["completion_ids"].shape
    assert resumed["advantages"].shape == reference["advantages"].shape
    losses = grpo_run.train_losses(trainer.state.log_history)
    assert losses and all(math.isfinite(x) for x in losses), trainer.state.log_history
