"""train-sampler-signature: TRL 0.15.x/0.16.x GRPO trains on transformers >= 4.52.

* Every cell: the status matches the installed versions, and the probe, run directly on the
  real ``trl.trainer.grpo_trainer`` (no version window), agrees with the code it finds.
* Affected cells (trl0.15.2-tf4.52.4, trl0.16.1-tf4.52.4): without the patch ``train()`` dies
  with TRL's exact TypeError; with it a 3-step GRPO run trains, and the sampler the real
  dataloader uses, and the batches GRPO received, hold each prompt ``num_generations`` times in
  one batch, consecutively, as TRL's RepeatRandomSampler makes them.
"""

import importlib.metadata
import importlib.util
import math
from collections import Counter

from trl_compat import _engine
from trl_compat.patches import declared

import pytest
from packaging.version import Version

from versions import installed

PATCH = declared("train-sampler-signature")
PID = PATCH.id
EXACT = "GRPOTrainer._get_train_sampler() takes 1 positional argument but 2 were given"


TRL, TF = installed("trl"), installed("transformers")
HAVE_TRL = TRL is not None and TF is not None and importlib.util.find_spec("trl") is not None
# Expectations from versions; the patch itself probes the code.
AFFECTED = HAVE_TRL and Version("0.15.0") <= TRL < Version("0.17.0") and TF >= Version("4.52.0")

needs_trl = pytest.mark.skipif(not HAVE_TRL, reason="needs trl")
affected_only = pytest.mark.skipif(
    not AFFECTED, reason="the bug needs trl 0.15.x/0.16.x with transformers >= 4.52 (cells trl0.15.2-tf4.52.4, trl0.16.1-tf4.52.4)"
)


@needs_trl
def test_probe_agrees_with_the_real_code(unpatched):
    import trl.trainer.grpo_trainer as module

    if AFFECTED:
        with unpatched(PID):
            verdict = PATCH.probe(module)
        assert verdict.needed is True, verdict
        assert "_get_eval_sampler" not in verdict.reason  # eval always took the dataset
        # Applied, the wrapper's signature takes the call: the probe no longer finds the bug.
        assert PATCH.probe(module).needed is False
    else:
        # Outside the window the probe, on the real code, finds nothing either.
        verdict = PATCH.probe(module)
        assert verdict.needed is False, verdict


def _grouped(indices, batch_size, generations):
    """Assert that each batch holds batch_size // generations prompts, each ``generations`` times in a row."""
    assert len(indices) % batch_size == 0, indices
    for start in range(0, len(indices), batch_size):
        batch = indices[start : start + batch_size]
        runs = [batch[i : i + generations] for i in range(0, batch_size, generations)]
        assert all(len(set(run)) == 1 for run in runs), batch  # consecutive repeats
        assert len({run[0] for run in runs}) == batch_size // generations, batch  # distinct prompts
        assert set(Counter(batch).values()) == {generations}, batch


def _sampler_of(dataloader):
    batch_sampler = getattr(dataloader, "batch_sampler", None)
    sampler = getattr(batch_sampler, "sampler", None) or getattr(dataloader, "sampler", None)
    return getattr(sampler, "sampler", sampler)  # accelerate may wrap it once more


@affected_only
def test_train_raises_type_error_without_patch(tmp_path, unpatched):
    import grpo_run

    with unpatched(PID):
        trainer = grpo_run.make_trainer(tmp_path, steps=3)
        with pytest.raises(TypeError) as error:
            trainer.train()
    assert str(error.value) == EXACT
    assert trainer.state.global_step == 0


@affected_only
def test_grpo_trains_and_batches_stay_grouped(tmp_path):
    from trl import GRPOTrainer

    import grpo_run

    received = []

    class Recording(GRPOTrainer):
        def _prepare_inputs(self, inputs):
            if self.model.training:
                received.append([x["prompt"] for x in inputs])
            return super()._prepare_inputs(inputs)

    dataset = grpo_run.tiny.prompt_dataset(8)
    trainer = grpo_run.make_trainer(tmp_path, steps=3, train_dataset=dataset, trainer_cls=Recording)
    assert PID in _engine.markers(GRPOTrainer._get_train_sampler)
    assert PID not in _engine.markers(GRPOTrainer._get_eval_sampler)  # not wrapped
    trainer.tiny_initial_trainable = grpo_run.trainable_snapshot(trainer)
    trainer.train()

    assert trainer.state.global_step == 3
    losses = grpo_run.train_losses(trainer.state.log_history)
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses), trainer.state.log_history
    assert grpo_run.changed_trainable(trainer), "no parameter moved"

    g, per_device = trainer.num_generations, trainer.args.per_device_train_batch_size
    assert g == grpo_run.NUM_GENERATIONS == 2 and per_device == 4

    # The sampler transformers' dataloader really uses: built through the wrapper, from the
    # dataset transformers passed, by TRL's own RepeatRandomSampler.
    dataloader = trainer.get_train_dataloader()
    sampler = _sampler_of(dataloader)
    assert type(sampler).__name__ == "RepeatRandomSampler", type(sampler)
    assert type(sampler).__module__ == "trl.trainer.grpo_trainer"
    assert len(sampler.data_source) == len(dataset) == 8
    indices = list(sampler)
    assert len(indices) == len(dataset) * g and sorted(set(indices)) == list(range(len(dataset)))
    _grouped(indices, per_device, g)

    # What GRPO received in its 3 steps: the sampler's first batches, as prompts.
    assert len(received) == 3, received
    prompts = dataset["prompt"]
    assert received == [[prompts[i] for i in indices[s * per_device : (s + 1) * per_device]] for s in range(3)]
    for batch in received:
        assert set(Counter(batch).values()) == {g} and len(set(batch)) == per_device // g, batch

    # Called with the dataset (what transformers does) or without (TRL's own call): same grouping.
    for sampler in (trainer._get_train_sampler(dataset), trainer._get_train_sampler()):
        assert list(sampler) == indices
