"""eval-before-train-ga: evaluating a GRPOTrainer before train() raises AttributeError (TRL 0.22.0 - 0.27.0).

* A real tiny GRPO trainer with ``loss_type="grpo"`` (the default ``"dapo"`` normalises by
  ``num_items_in_batch`` and is not affected) and ``gradient_accumulation_steps=2``.
* Without the patch (in the window): ``trainer.evaluate()`` before ``train()`` raises
  ``AttributeError: ... no attribute 'current_gradient_accumulation_steps'``; ``eval_on_start=True``
  makes ``train()`` raise it.
* With it: ``evaluate()`` returns a finite ``eval_loss``; ``eval_on_start=True`` + ``train()``
  completes with the eval and training losses logged.
* By value: the loss TRL computes on the inputs ``evaluate()`` prepared, with the advantages set to
  1 (coefficient exp(0) = 1 per token, so the "grpo" loss is -1 / normaliser), is exactly -1.0 in
  eval mode, before training and with the accumulation steps of a trained run (2) set: TRL
  0.27.1's normaliser 1. Unpatched, the latter is -0.5.
* The probe on the cell's TRL and on code written here; "not needed" from 0.27.1 (the 0.28.0 cell).
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import eval_before_train_ga as ebt

from packaging.version import Version

from versions import installed

PID = "eval-before-train-ga"
TRL = installed("trl")
GA = 2
MESSAGE = "object has no attribute 'current_gradient_accumulation_steps'"

BUGGY = TRL is not None and Version("0.22.0") <= TRL < Version("0.27.1")
needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.22.0"), reason=f"TRL {TRL}: before the GRPO loss divided by it")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} is outside 0.22.0 - 0.27.0")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _trainer(tmp_path, **overrides):
    import os

    from trl import GRPOTrainer

    import grpo_run
    import tiny

    config = dict(loss_type="grpo", gradient_accumulation_steps=GA)
    config.update(overrides)
    args, _ = grpo_run.make_config(os.path.join(tmp_path, "out"), steps=1, **config)
    return GRPOTrainer(
        model=tiny.save_tiny(os.path.join(tmp_path, "tiny-qwen2"), "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        eval_dataset=tiny.prompt_dataset(4),
        processing_class=tiny.make_tokenizer(),
    )


def _eval_on_start(tmp_path):
    return _trainer(tmp_path, eval_on_start=True, eval_strategy="steps", eval_steps=100)


def _loss_with_unit_advantages(trainer, inputs):
    inputs = dict(inputs, advantages=torch.ones_like(inputs["advantages"]))
    trainer.model.eval()
    with torch.no_grad():
        return trainer.compute_loss(trainer.model, inputs).item()


@needs_bug
def test_bug_without_the_patch_evaluate_before_train_raises(tmp_path, unpatched):
    trainer = _trainer(tmp_path)
    with unpatched(PID):
        with pytest.raises(AttributeError, match=MESSAGE):
            trainer.evaluate()


@needs_bug
def test_bug_without_the_patch_eval_on_start_raises(tmp_path, unpatched):
    trainer = _eval_on_start(tmp_path)
    with unpatched(PID):
        with pytest.raises(AttributeError, match=MESSAGE):
            trainer.train()


@needs_trl
def test_evaluate_before_train_gives_the_loss_with_normaliser_1(tmp_path, unpatched):
    import grpo_run

    trainer = _trainer(tmp_path)
    seen = grpo_run.spy_loss_inputs(trainer)
    metrics = trainer.evaluate()
    del trainer.compute_loss  # the spy: the class's method (patched or not) from here on
    assert math.isfinite(metrics["eval_loss"]) and seen
    assert not hasattr(trainer, ebt.ATTRIBUTE) or TRL >= Version("0.27.1")  # nothing left behind
    # before training, and with the accumulation steps a trained run leaves on the trainer
    assert _loss_with_unit_advantages(trainer, seen[0]) == -1.0
    trainer.current_gradient_accumulation_steps = GA
    assert _loss_with_unit_advantages(trainer, seen[0]) == -1.0
    assert trainer.current_gradient_accumulation_steps == GA  # restored
    if BUGGY:
        with unpatched(PID):
            assert _loss_with_unit_advantages(trainer, seen[0]) == -1.0 / GA


@needs_trl
def test_eval_on_start_then_train_completes(tmp_path):
    trainer = _eval_on_start(tmp_path)
    trainer.train()
    history = trainer.state.log_history
    eval_losses = [e["eval_loss"] for e in history if "eval_loss" in e]
    assert eval_losses and all(math.isfinite(x) for x in eval_losses)
    assert any("loss" in e for e in history)


def test_training_calls_run_trls_code_untouched():
    calls = []

    class Model:
        training = True

    class Trainer:
        model = Model()

        def compute_loss(self, model, inputs):
            calls.append(getattr(self, ebt.ATTRIBUTE, None))
            return 0

    wrapped = ebt._wrap_compute_loss(Trainer.compute_loss)
    trainer = Trainer()
    trainer.current_gradient_accumulation_steps = 4
    wrapped(trainer, None, {})
    Trainer.model.training = False
    wrapped(trainer, None, {})
    assert calls == [4, 1] and trainer.current_gradient_accumulation_steps == 4
    del trainer.current_gradient_accumulation_steps
    wrapped(trainer, None, {})
    assert calls[-1] == 1 and not hasattr(trainer, ebt.ATTRIBUTE)


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = ebt.probe(module)
    assert verdict.needed is BUGGY, verdict


class _Buggy:
    def _compute_loss(self, model, inputs):
        loss = inputs["loss"]
        loss = loss / self.current_gradient_accumulation_steps
        return loss


class _Fixed:
    def _compute_loss(self, model, inputs):
        mode = "train" if self.model.training else "eval"
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0  # no accum in eval
        return inputs["loss"] / normalizer


class _LigerOnly(_Fixed):
    def compute_liger_loss(self, unwrapped_model, inputs):
        return inputs["loss"] / self.current_gradient_accumulation_steps


class _Neither:
    pass


@pytest.mark.parametrize("cls, needed", [(_Buggy, True), (_Fixed, False), (_LigerOnly, True), (_Neither, None)])
def test_probe_on_written_code(cls, needed):
    assert ebt.probe(type("M", (), {"GRPOTrainer": cls})).needed is needed
