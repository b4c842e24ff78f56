"""dataloader-workers: GRPO trains with ``dataloader_num_workers=2``, forked or spawned workers.

* Every cell: the status matches the installed TRL, and the probe, run directly on the real code
  (no version window), agrees with it and names the part(s) of the bug the versions imply.
* TRL 0.14.0 - 0.18.1: without the patch, spawn workers cannot receive TRL's local collator
  (``AttributeError: Can't pickle local object 'GRPOTrainer.__init__.<locals>.data_collator'``);
  with it, a 2-step GRPO run with 2 spawned workers trains on exactly the batches the same run
  with 0 workers trains on (compared by value), each prompt ``num_generations`` times (TRL >= 0.15).
* TRL 0.17.0 - 0.18.1 with transformers >= 4.52 (cell trl0.17.0-tf4.52.4): without the patch the
  (forked) workers die on start with TRL's ``seed_worker() missing 2 required positional
  arguments``; the spawn run above covers the patched path (each worker seeded by
  ``partial(seed_worker, num_workers=2, rank=0)``).
"""

import contextlib
import importlib.util
import math
import multiprocessing
from collections import Counter

from trl_compat.patches import declared
from trl_compat.patches.dataloader_workers import identity

import pytest
from packaging.version import Version

from versions import installed

PATCH = declared("dataloader-workers")
PID = PATCH.id
TRL, TF = installed("trl"), installed("transformers")
HAVE_TRL = TRL is not None and importlib.util.find_spec("trl") is not None
LOCAL_COLLATOR = HAVE_TRL and Version("0.14.0") <= TRL < Version("0.18.2")
BARE_SEED_WORKER = LOCAL_COLLATOR and TRL >= Version("0.17.0") and TF >= Version("4.52.0")
NO_PICKLE = "Can't pickle local object 'GRPOTrainer.__init__.<locals>.data_collator'"
SEED_WORKER = "seed_worker() missing 2 required positional arguments: 'num_workers' and 'rank'"

needs_trl = pytest.mark.skipif(not HAVE_TRL, reason="needs trl")
collator_only = pytest.mark.skipif(not LOCAL_COLLATOR, reason="TRL's collator is a local function in trl 0.14.0-0.18.1")
seed_worker_only = pytest.mark.skipif(
    not BARE_SEED_WORKER, reason="the bare seed_worker breaks trl 0.17.0-0.18.1 on transformers >= 4.52 only"
)


@needs_trl
def test_probe_agrees_with_the_real_code(unpatched):
    import trl.trainer.grpo_trainer as module

    if LOCAL_COLLATOR:
        with unpatched(PID):
            verdict = PATCH.probe(module)
        assert verdict.needed is True, verdict
        assert ("local data_collator" in verdict.reason) is LOCAL_COLLATOR, verdict
        assert ("bare seed_worker(worker_id" in verdict.reason) is BARE_SEED_WORKER, verdict
    else:
        verdict = PATCH.probe(module)
        assert verdict.needed is False, verdict


@contextlib.contextmanager
def start_method(method):
    old = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method(method, force=True)
    try:
        yield
    finally:
        multiprocessing.set_start_method(old, force=True)


def _train(tmp_path, workers):
    """A 2-step GRPO run; returns the trainer and the prompts of each batch GRPO received."""
    from trl import GRPOTrainer

    import grpo_run

    received = []

    class Recording(GRPOTrainer):
        def _prepare_inputs(self, inputs):
            if self.model.training:
                received.append([x["prompt"] for x in inputs])
            return super()._prepare_inputs(inputs)

    trainer = grpo_run.make_trainer(
        tmp_path, steps=2, trainer_cls=Recording, dataloader_num_workers=workers, train_dataset=grpo_run.tiny.prompt_dataset(8)
    )
    trainer.train()
    return trainer, received


@collator_only
def test_spawn_workers_cannot_pickle_trls_collator_without_patch(tmp_path, unpatched):
    with unpatched(PID), start_method("spawn"):
        with pytest.raises(AttributeError) as error:
            _train(tmp_path, workers=2)
    assert NO_PICKLE in str(error.value)


@seed_worker_only
def test_workers_die_in_seed_worker_without_patch(tmp_path, unpatched):
    with unpatched(PID), start_method("fork"):
        with pytest.raises(TypeError) as error:
            _train(tmp_path, workers=2)
    assert "Caught TypeError in DataLoader worker process" in str(error.value)
    assert SEED_WORKER in str(error.value)


@collator_only
def test_spawn_workers_yield_the_grouped_batches_of_zero_workers(tmp_path):
    import grpo_run

    reference, expected = _train(tmp_path / "w0", workers=0)
    assert reference.data_collator is identity  # the patch's module-level collator, in every run
    with start_method("spawn"):
        trainer, received = _train(tmp_path / "w2", workers=2)
    assert trainer.args.dataloader_num_workers == 2 and trainer.state.global_step == 2
    losses = grpo_run.train_losses(trainer.state.log_history)
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses), trainer.state.log_history

    assert len(expected) == 2 and received == expected  # by value, batch by batch
    g = trainer.num_generations
    for batch in received:
        if TRL >= Version("0.15.0"):  # each prompt num_generations times (0.14 repeats after the dataloader)
            assert set(Counter(batch).values()) == {g}, batch
        else:
            assert len(set(batch)) == len(batch), batch
