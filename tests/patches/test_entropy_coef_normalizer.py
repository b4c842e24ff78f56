"""entropy-coef-normalizer: the dapo/cispo/vespo entropy bonus was divided by the policy loss's token count (TRL 1.8.0 - 1.9.x).

* One real tiny GRPO step: ``loss_type="dapo"``, ``entropy_coef=COEF``, ``gradient_accumulation_steps=2``,
  ``steps_per_generation=4`` (two micro-batches of 4 completions out of a generation batch of 16), fixed
  completions (``fixed_completions``: 8 x 3 + 8 x 8 = 88 tokens in the generation batch). The inputs of its
  first loss call are kept and ``GRPOTrainer._compute_loss`` is called again on them with every advantage 0:
  the policy term is 0, so TRL's loss is ``-COEF * entropy_loss`` alone. The entropies and the entropy mask
  are read from the call (the model's own).
* By hand, from those entropies, ``S`` their sum over ``effective_mask`` (the completion mask times the
  ``top_entropy_quantile`` mask): TRL 1.9.x returns ``-COEF * S / (88 * GA / steps_per_generation)`` in
  train mode (``-COEF * S / 88`` in eval), TRL 1.10.0 (and the patch) ``-COEF * S / effective_mask.sum() /
  GA`` (``/ 1`` in eval). With ``top_entropy_quantile=0.5`` the two differ by about 2x. The gradient of
  the loss is the gradient of the same formula. Other loss types and ``entropy_coef=0``: the patch
  changes nothing. The wrapper on TRL 1.8.0's, 1.9.0's and 1.9.1's normaliser, also stacked on
  ``dapo-generation-batch-normalizer``; the probe on the cell's TRL and on code written here.
"""

import linecache
import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat._engine.patcher import MARKER
from trl_compat.patches import dapo_generation_batch_normalizer as dgb
from trl_compat.patches import entropy_coef_normalizer as ecn

from packaging.version import Version

from versions import installed

PID = "entropy-coef-normalizer"
TRL = installed("trl")
COEF = 0.1
GA, STEPS_PER_GENERATION = 2, 4
GENERATION_TOKENS = 8 * 3 + 8 * 8

needs_entropy = pytest.mark.skipif(TRL is None or TRL < Version("1.8.0"), reason=f"TRL {TRL}: no entropy_coef before 1.8.0")
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("1.8.0") <= TRL < Version("1.10.0")), reason=f"TRL {TRL} is outside 1.8.0 - 1.9.x"
)
# (mode, top_entropy_quantile): the last two are where TRL 1.9.x's and 1.10.0's bonus differ clearly
CASES = [("train", 1.0), ("train", 0.5), ("eval", 0.5)]


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """A trainer after one real dapo step with the entropy bonus, and the inputs of its first loss call."""
    import fixed_completions
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path_factory.mktemp("entropy"),
        steps=1,
        loss_type="dapo",
        entropy_coef=COEF,
        gradient_accumulation_steps=GA,
        steps_per_generation=STEPS_PER_GENERATION,
    )
    assert "entropy_coef" not in trainer.tiny_dropped_config_keys and trainer._entropy_bonus_enabled
    assert trainer.beta == 0.0 and not trainer.use_adaptive_entropy and trainer.top_entropy_quantile == 1.0
    fixed_completions.install(trainer)
    seen = grpo_run.spy_loss_inputs(trainer)
    trainer.train()
    assert len(seen) == GA
    assert float(seen[0]["num_items_in_batch"]) == GENERATION_TOKENS
    assert trainer.current_gradient_accumulation_steps == GA  # what the train-mode calls below divide by
    return trainer, seen[0]


def _call(trainer, inputs, mode="train", quantile=1.0, loss_type="dapo", advantages=0.0, coef=COEF):
    """TRL's loss on ``inputs`` (advantages set to ``advantages``, or the step's own where None), its gradient
    on the model's parameters, and the entropies and entropy mask it used (read from the call)."""
    seen = {}
    logps, high = trainer._get_per_token_logps_and_entropies, trainer.get_high_entropy_mask

    def entropies(*args, **kwargs):  # the model's own entropies, handed on unchanged
        out = logps(*args, **kwargs)
        seen["entropies"] = out[1]
        return out

    def entropy_mask(*args, **kwargs):
        seen["entropy_mask"] = out = high(*args, **kwargs)
        return out

    batch = dict(inputs)
    if advantages is not None:
        batch["advantages"] = torch.full_like(inputs["advantages"], advantages)
    saved = (trainer.top_entropy_quantile, trainer.loss_type, trainer.entropy_coef, trainer._entropy_bonus_enabled)
    trainer._get_per_token_logps_and_entropies, trainer.get_high_entropy_mask = entropies, entropy_mask
    # as GRPOTrainer.__init__ derives them from the config
    trainer.top_entropy_quantile, trainer.loss_type, trainer.entropy_coef = quantile, loss_type, coef
    trainer._entropy_bonus_enabled = coef != 0.0
    trainer.model.train(mode == "train")
    try:
        loss = trainer._compute_loss(trainer.model, batch)
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    finally:
        del trainer._get_per_token_logps_and_entropies, trainer.get_high_entropy_mask
        trainer.top_entropy_quantile, trainer.loss_type, trainer.entropy_coef, trainer._entropy_bonus_enabled = saved
        trainer.model.train()
    return loss.detach(), grads, params, seen


def _by_hand(inputs, seen, mode):
    """(TRL 1.9.x's entropy term, TRL 1.10.0's) from the entropies, the masks and num_items_in_batch, with grad."""
    mask = inputs["completion_mask"].float()
    effective = mask if seen.get("entropy_mask") is None else mask * seen["entropy_mask"]
    total = (seen["entropies"] * effective).sum()
    count = float(inputs["num_items_in_batch"])
    normaliser = count * GA / STEPS_PER_GENERATION if mode == "train" else count  # 1.9.1's rescale in train mode
    accumulation = GA if mode == "train" else 1
    return -COEF * total / normaliser, -COEF * total / effective.sum().clamp(min=1.0) / accumulation


def _same_gradient(grads, reference, params):
    expected = torch.autograd.grad(reference, params, retain_graph=True, allow_unused=True)
    for got, want in zip(grads, expected):
        if want is None:
            assert got is None or torch.count_nonzero(got) == 0
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-7)


def _check(trainer, inputs, seen, quantile):
    mask = inputs["completion_mask"]
    assert mask.size(1) == 8 and set(mask.sum(1).tolist()) <= {3, 8}  # the fixed completions
    if quantile < 1.0:
        kept = (mask * seen["entropy_mask"]).sum()
        assert 0 < kept < mask.sum()  # some loss tokens are out of the entropy mask


@needs_bug
@pytest.mark.parametrize("mode, quantile", CASES)
def test_bug_without_the_patch_the_bonus_is_divided_by_the_token_count(step, unpatched, mode, quantile):
    trainer, inputs = step
    with unpatched(PID):
        loss, grads, params, seen = _call(trainer, inputs, mode, quantile)
    _check(trainer, inputs, seen, quantile)
    buggy, fixed = _by_hand(inputs, seen, mode)
    print(f"{mode} q={quantile}: TRL {loss.item():.6f}, 1.9.x by hand {buggy.item():.6f}, 1.10.0 by hand {fixed.item():.6f}")
    assert loss.item() == pytest.approx(buggy.item(), rel=1e-5)
    _same_gradient(grads, buggy, params)
    if quantile < 1.0:
        assert abs(buggy.item() / fixed.item() - 1) > 0.3


@needs_entropy
@pytest.mark.parametrize("mode, quantile", CASES)
def test_the_bonus_is_the_mean_entropy_over_the_masked_tokens(step, mode, quantile):
    trainer, inputs = step
    loss, grads, params, seen = _call(trainer, inputs, mode, quantile)
    _check(trainer, inputs, seen, quantile)
    fixed = _by_hand(inputs, seen, mode)[1]
    print(f"{mode} q={quantile}: TRL {TRL} {loss.item():.6f}, 1.10.0 by hand {fixed.item():.6f}")
    assert loss.item() == pytest.approx(fixed.item(), rel=1e-5)
    _same_gradient(grads, fixed, params)
    assert trainer.loss_type == "dapo" and trainer.top_entropy_quantile == 1.0  # the test's own settings are back
    assert "_get_per_token_logps_and_entropies" not in vars(trainer) and "get_high_entropy_mask" not in vars(trainer)


@needs_bug
@pytest.mark.parametrize("loss_type, coef", [("bnpo", COEF), ("grpo", COEF), ("dapo", 0.0)])
def test_other_loss_types_and_no_bonus_are_left_alone(step, unpatched, loss_type, coef):
    trainer, inputs = step
    patched = _call(trainer, inputs, "train", 0.5, loss_type, advantages=None, coef=coef)[0]
    with unpatched(PID):
        before = _call(trainer, inputs, "train", 0.5, loss_type, advantages=None, coef=coef)[0]
    assert float(patched) == float(before) and float(patched) != 0.0


@pytest.mark.skipif(TRL is None or TRL < Version("1.0.0"), reason=f"TRL {TRL}: another loss code")
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = ecn.probe(module)
    if TRL < Version("1.8.0"):
        assert verdict.needed is False and "no entropy bonus" in verdict.reason, verdict
    elif TRL < Version("1.10.0"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


# -- the wrapper on TRL 1.8.0's, 1.9.0's and 1.9.1's normaliser, alone and above the dapo patch -------------

ENTROPIES = torch.tensor([[1.0, 2.0, 3.0, 0.5], [4.0, 1.5, 0.0, 0.0]])
MASK = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]])
HIGH = torch.tensor([[False, True, True, False], [True, True, False, False]])
NUM_ITEMS = 20.0  # the generation batch's tokens (steps_per_generation = 4 micro-batches)


class _Trainer:
    """TRL 1.8.0 - 1.9.x's entropy term in a few lines; ``form``: (clamped, rescaled) as ``ecn._form``."""

    loss_type, _entropy_bonus_enabled, use_adaptive_entropy, entropy_coef = "dapo", True, False, COEF
    top_entropy_quantile = 0.5
    current_gradient_accumulation_steps = GA
    accelerator = types.SimpleNamespace(num_processes=1)

    def __init__(self, training, form):
        self.model = types.SimpleNamespace(training=training)
        self.args = types.SimpleNamespace(steps_per_generation=STEPS_PER_GENERATION, gradient_accumulation_steps=GA)
        self.form = form

    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        return None, ENTROPIES, None

    def get_high_entropy_mask(self, entropies, mask, threshold):
        return HIGH

    def _compute_loss(self, model, inputs):
        _, entropies, _ = self._get_per_token_logps_and_entropies(model)
        entropy_mask = self.get_high_entropy_mask(entropies, MASK, 0.5) if self.top_entropy_quantile < 1.0 else None
        count = inputs["num_items_in_batch"]
        normalizer = (count.clamp(min=1.0) if self.form[0] else count) / self.accelerator.num_processes
        if self.form[1] and self.model.training:
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        effective = MASK if entropy_mask is None else MASK * entropy_mask
        return inputs["policy"] - self.entropy_coef * (entropies * effective).sum() / normalizer


def _dapo_below(original):
    wrapped = dgb._wrap_compute_loss(original)
    setattr(wrapped, MARKER, frozenset({dgb.PATCH_ID}))  # as the Patcher marks it
    return wrapped


# (clamped, rescaled) of the release's normaliser, and whether the dapo patch is stacked below (where needed)
@pytest.mark.parametrize(
    "form, dapo_below",
    [((False, False), False), ((False, False), True), ((True, False), False), ((True, False), True), ((True, True), False)],
    ids=["1.8.0", "1.8.0-dapo-patch", "1.9.0", "1.9.0-dapo-patch", "1.9.1"],
)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("quantile", [1.0, 0.5])
def test_the_wrapper_gives_the_mean_over_the_effective_mask(form, dapo_below, training, quantile):
    original = _dapo_below(_Trainer._compute_loss) if dapo_below else _Trainer._compute_loss
    wrapped = ecn._wrap_compute_loss(original, *form)
    trainer = _Trainer(training, form)
    trainer.top_entropy_quantile = quantile
    inputs = {"completion_mask": MASK, "num_items_in_batch": torch.tensor(NUM_ITEMS), "policy": torch.tensor(0.25)}
    effective = MASK * HIGH if quantile < 1.0 else MASK
    expected = 0.25 - COEF * float((ENTROPIES * effective).sum() / effective.sum() / (GA if training else 1))
    assert float(wrapped(trainer, "model", inputs=inputs)) == pytest.approx(expected, rel=1e-6)
    assert float(wrapped(trainer, "model", inputs)) == pytest.approx(expected, rel=1e-6)
    assert "_get_per_token_logps_and_entropies" not in vars(trainer) and "get_high_entropy_mask" not in vars(trainer)
    assert float(original(trainer, "model", inputs)) != pytest.approx(expected, rel=1e-3)  # differs without the fix
    trainer.loss_type = "bnpo"  # not the token-count branch: TRL's value
    assert float(wrapped(trainer, "model", inputs)) == float(original(trainer, "model", inputs))


def test_the_wrapper_reads_the_coefficient_before_the_call():
    class _Adaptive(_Trainer):
        use_adaptive_entropy, _last_world_entropy = True, 2.0

        def _compute_loss(self, model, inputs):
            self._get_per_token_logps_and_entropies(model)
            applied = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
            self._last_world_entropy, self.entropy_coef = 0.0, 1.0  # TRL's update acts on the next step only
            return inputs["policy"] - applied * float((ENTROPIES * MASK).sum()) / inputs["num_items_in_batch"]

    wrapped = ecn._wrap_compute_loss(_Adaptive._compute_loss, True, True)
    inputs = {"completion_mask": MASK, "num_items_in_batch": torch.tensor(NUM_ITEMS), "policy": torch.tensor(0.25)}
    for target, coef in [(1.0, 0.0), (3.0, COEF)]:  # gated off above the target, on below it
        trainer = _Adaptive(False, (True, True))
        trainer.top_entropy_quantile, trainer.args.entropy_target = 1.0, target
        expected = 0.25 - coef * float((ENTROPIES * MASK).sum() / MASK.sum())
        assert float(wrapped(trainer, "model", inputs)) == pytest.approx(expected, rel=1e-6)


# -- the probe on code written here: TRL 1.8 - 1.9's method, 1.10.0's, and what makes it undecided ----------

_METHOD = """
def _compute_loss(self, model, inputs):
    mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
    per_token_logps, entropies, aux_loss = self._get_per_token_logps_and_entropies(
        model, input_ids, compute_entropy=True,
    )
    if self.top_entropy_quantile < 1.0:
        entropy_mask = self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
    else:
        entropy_mask = None
    mode = "train" if self.model.training else "eval"
    if self.loss_type in ["cispo", "dapo", "vespo"]:
        NORMALIZER
        loss = (per_token_loss * mask).sum() / normalizer
    if self._entropy_bonus_enabled:
        effective_mask = mask if entropy_mask is None else mask * entropy_mask
        if self.loss_type in ["cispo", "dapo", "vespo"]:
            # a comment the probe does not read
            ENTROPY
        else:
            entropy_loss = (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0) / normalizer
        if self.use_adaptive_entropy:
            apply_coef = self.entropy_coef if self._last_world_entropy <= self.args.entropy_target else 0.0
        else:
            apply_coef = self.entropy_coef
        loss = loss - apply_coef * entropy_loss
    return loss
"""
_PLAIN = 'normalizer = inputs["num_items_in_batch"] / self.accelerator.num_processes'
_CLAMPED = 'normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes'
_RESCALED = (
    _CLAMPED
    + """
        if mode == "train":
            normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation"""
)
_BUGGY = "entropy_loss = (entropies * effective_mask).sum() / normalizer"


def _written(normalizer=_CLAMPED, entropy=_BUGGY, replace=("", "")):
    source = _METHOD.replace("NORMALIZER", normalizer).replace("ENTROPY", entropy).replace(*replace)
    filename = f"<entropy-written-{len(linecache.cache)}-{hash(source)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # so that inspect reads it
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)  # code written here
    return type("M", (), {"GRPOTrainer": type("GRPOTrainer", (), {"_compute_loss": namespace["_compute_loss"]})})


@pytest.mark.parametrize(
    "module, needed, form",
    [
        (_written(_PLAIN), True, (False, False)),  # TRL 1.8.0
        (_written(_CLAMPED), True, (True, False)),  # TRL 1.9.0
        (_written(_RESCALED), True, (True, True)),  # TRL 1.9.1 - 1.9.2
        (
            _written(
                entropy="accumulation_factor = 1.0\n            "
                + _BUGGY.replace("normalizer", "effective_mask.sum().clamp(min=1.0) / accumulation_factor")
            ),
            False,
            None,
        ),
        (_written(replace=("self._entropy_bonus_enabled", "False")), False, None),  # before 1.8.0: no bonus
        (_written(_PLAIN + "\n        " + _CLAMPED), None, None),  # two normalisers
        (_written("normalizer = inputs['num_items_in_batch'] / 2"), None, None),  # an unknown normaliser
        (_written(entropy=_BUGGY + "\n            " + _BUGGY), None, None),  # the line twice
        (_written(entropy=_BUGGY.replace("/ normalizer", "/ normalizer / 2")), None, None),  # another term
        (_written(replace=('["cispo", "dapo", "vespo"]:\n            #', '["dapo"]:\n            #')), None, None),
        (_written(replace=("mask * entropy_mask", "entropy_mask")), None, None),  # another effective mask
        (_written(replace=("<= self.args.entropy_target", "< self.args.entropy_target")), None, None),  # other gating
        (_written(replace=("loss = loss - apply_coef", "loss = loss + apply_coef")), None, None),
        (type("M", (), {"GRPOTrainer": type("GRPOTrainer", (), {})}), None, None),
    ],
)
def test_probe_on_written_code(module, needed, form):
    assert ecn.probe(module).needed is needed
    if needed:
        assert ecn._form(ecn.code(module.GRPOTrainer._compute_loss)) == form
