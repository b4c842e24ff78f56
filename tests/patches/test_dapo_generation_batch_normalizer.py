"""dapo-generation-batch-normalizer: the dapo loss was scaled by GA / steps_per_generation (TRL 0.22.0 - 1.9.0).

* Real tiny GRPO runs: ``loss_type="dapo"``, ``steps_per_generation=4``,
  ``gradient_accumulation_steps=2``, one optimizer step (two micro-batches of 4 completions out of
  a generation batch of 16). The completions are fixed (``fixed_completions``): even rows end in
  EOS after 3 tokens, odd rows run 8 tokens, so the generation batch holds 8 x 3 + 8 x 8 = 88
  tokens, hand-counted from the ids.
* Each micro-batch's loss with every advantage set to 1 (each token's loss is -1 before the
  optimizer step: ratio exp(0)) is ``-m / normaliser``, ``m`` its own hand-counted tokens.
  Without the patch (0.22.0 - 1.9.0) the normaliser is 88, the generation batch; with it (and on
  TRL >= 1.9.1, where the patch is "not needed") 88 x GA / steps_per_generation = 44, one
  accumulation window, as TRL 1.9.1 computes it. Unpatched / patched = GA / steps_per_generation
  = 0.5: every step's loss and gradient halved.
* Evaluation (no accumulation) keeps TRL's normaliser; the probe on the cell's TRL and on code
  written here.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import dapo_generation_batch_normalizer as dgb

from packaging.version import Version

from versions import installed

PID = "dapo-generation-batch-normalizer"
TRL = installed("trl")
GA, STEPS_PER_GENERATION = 2, 4
GENERATION_TOKENS = 8 * 3 + 8 * 8

needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.22.0"), reason=f"TRL {TRL}: before num_items_in_batch")
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("1.9.1")), reason=f"TRL {TRL} is outside 0.22.0 - 1.9.0"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _run(tmp_path, loss_type="dapo"):
    """One optimizer step; per micro-batch: (hand-counted tokens, num_items_in_batch, unit-advantage loss)."""
    import fixed_completions
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path, steps=1, loss_type=loss_type, gradient_accumulation_steps=GA, steps_per_generation=STEPS_PER_GENERATION
    )
    assert trainer.args.steps_per_generation == STEPS_PER_GENERATION
    fixed_completions.install(trainer)
    eos = trainer.processing_class.eos_token_id
    seen = []
    method = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        with torch.no_grad():
            unit = method(model, dict(inputs, advantages=torch.ones_like(inputs["advantages"])), *args, **kwargs)
        seen.append((fixed_completions.tokens_to_eos(inputs["completion_ids"], eos), float(inputs["num_items_in_batch"]), float(unit)))
        return method(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    trainer.train()
    assert len(seen) == GA, seen
    return seen


@needs_bug
def test_bug_without_the_patch_the_loss_is_scaled_by_ga_over_steps_per_generation(tmp_path, unpatched):
    with unpatched(PID):
        seen = _run(tmp_path)
    for tokens, num_items, unit_loss in seen:
        assert num_items == GENERATION_TOKENS
        assert unit_loss == pytest.approx(-tokens / GENERATION_TOKENS, rel=1e-5)
    fixed = -sum(tokens for tokens, _, _ in seen) / (GENERATION_TOKENS * GA / STEPS_PER_GENERATION)
    assert sum(unit for _, _, unit in seen) / fixed == pytest.approx(GA / STEPS_PER_GENERATION, rel=1e-5)


@needs_trl
def test_the_normaliser_is_one_accumulation_window(tmp_path):
    seen = _run(tmp_path)
    for tokens, num_items, unit_loss in seen:
        assert num_items == GENERATION_TOKENS  # TRL's count of the generation batch, handed on unchanged
        assert unit_loss == pytest.approx(-tokens / (GENERATION_TOKENS * GA / STEPS_PER_GENERATION), rel=1e-5)


@needs_trl
def test_a_loss_without_the_token_count_is_left_alone(tmp_path):
    # "bnpo" divides by the micro-batch's own tokens and by the accumulation steps: -1 / GA per micro-batch
    for _, _, unit_loss in _run(tmp_path, loss_type="bnpo"):
        assert unit_loss == pytest.approx(-1.0 / GA, rel=1e-5)


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = dgb.probe(module)
    if TRL < Version("1.9.1"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


# -- the wrapper: eval calls and the caller's inputs ---------------------------------------------------


class _Model:
    def __init__(self, training):
        self.training = training


class _Trainer:
    loss_type = "dapo"
    current_gradient_accumulation_steps = GA

    def __init__(self, training):
        self.model = _Model(training)
        self.args = type("Args", (), {"steps_per_generation": STEPS_PER_GENERATION, "gradient_accumulation_steps": GA})()

    def _compute_loss(self, model, inputs):
        return inputs["num_items_in_batch"]


@pytest.mark.parametrize("training, normaliser", [(True, 88 * GA / STEPS_PER_GENERATION), (False, 88)])
def test_the_wrapper_rescales_in_train_mode_only(training, normaliser):
    wrapped = dgb._wrap_compute_loss(_Trainer._compute_loss)
    trainer = _Trainer(training)
    inputs = {"num_items_in_batch": torch.tensor(88)}
    assert float(wrapped(trainer, trainer.model, inputs=inputs)) == normaliser
    assert float(wrapped(trainer, trainer.model, inputs)) == normaliser
    assert int(inputs["num_items_in_batch"]) == 88  # the caller's dict is not changed


# -- the probe on code written here: TRL 0.22's branch, 1.9.0's clamp, 1.9.1's rescale ------------------


class _Dapo022:
    def _compute_loss(self, model, inputs):
        if self.loss_type == "dapo":
            normalizer = inputs["num_items_in_batch"] / self.accelerator.num_processes
            return normalizer


class _Clamp190:
    def _compute_loss(self, model, inputs):
        if self.loss_type in ["cispo", "dapo", "vespo"]:
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            return normalizer


class _Fixed191:
    def _compute_loss(self, model, inputs, mode):
        if self.loss_type in ["cispo", "dapo", "vespo"]:
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            return normalizer


class _OtherUse:
    def _compute_loss(self, model, inputs):
        return inputs.get("num_items_in_batch")


class _NoLoss:
    pass


def _module(cls):
    return type("M", (), {"GRPOTrainer": cls})


@pytest.mark.parametrize("cls, needed", [(_Dapo022, True), (_Clamp190, True), (_Fixed191, False), (_OtherUse, None), (_NoLoss, None)])
def test_probe_on_written_code(cls, needed):
    assert dgb.probe(_module(cls)).needed is needed
