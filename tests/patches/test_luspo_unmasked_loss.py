"""luspo-unmasked-loss: the LUSPO loss summed pad positions of a (B, T) per-token loss (TRL 0.28.0 - 1.9.x).

* A real tiny GRPO step with ``loss_type="luspo"`` (``importance_sampling_level="token"``, the
  default) on fixed completions (``fixed_completions``): even rows end in EOS after 3 tokens and are
  padded to 8, odd rows run 8 tokens, so the completion mask is known by hand. Its inputs are kept and
  ``GRPOTrainer._compute_loss`` is called again on them with fixed advantages ``A`` and
  ``old_per_token_logps = logps - DELTA``, ``logps`` the model's own (read from the call), so the
  log-ratio is ``DELTA`` (+0.15 on the first 3 columns, -0.15 after: inside the clip range) and each
  token's loss is ``-exp(DELTA[b, t]) * A[b]``, varying along the row: the case the bug gets wrong.
* By hand: TRL < 1.10 returns ``mean over (b, t) of -exp(DELTA) * A * L_b`` (pad columns included);
  TRL 1.10.0 (and the patch) ``mean over b of sum over the L_b tokens of -exp(DELTA) * A``. With
  ``importance_sampling_level="sequence"`` the per-token loss is (B, 1) and both formulas agree:
  patched = unpatched = by hand. The attributes the fix swaps are back after the call; the probe
  on the cell's TRL and on code written here.
"""

import contextlib
import linecache

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import luspo_unmasked_loss as lul

from packaging.version import Version

from versions import installed

PID = "luspo-unmasked-loss"
TRL = installed("trl")
ADVANTAGES = [1.0, -0.5, 2.0, -1.5]

needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.28.0"), reason=f"TRL {TRL}: no luspo loss before 0.28.0")
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.28.0") <= TRL < Version("1.10.0")), reason=f"TRL {TRL} is outside 0.28.0 - 1.9.x"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """A trainer after one real luspo step, and the inputs of its loss call."""
    import fixed_completions
    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path_factory.mktemp("luspo"), steps=1, loss_type="luspo")
    assert trainer.importance_sampling_level == "token" and trainer.beta == 0.0
    fixed_completions.install(trainer)
    seen = grpo_run.spy_loss_inputs(trainer)
    trainer.train()
    assert len(seen) == 1
    return trainer, seen[0]


def _loss(trainer, inputs, level):
    """TRL's loss on ``inputs`` with log-ratio DELTA and ADVANTAGES; also the mask and DELTA used."""
    mask = inputs["completion_mask"].float()
    rows, width = mask.shape
    # +0.15 on the first 3 columns (every row's tokens), -0.15 on the rest (the short rows' padding)
    delta = torch.full((rows, width), -0.15)
    delta[:, :3] = 0.15
    captured = []
    logps = trainer._get_per_token_logps_and_entropies

    def spy(*args, **kwargs):  # the model's own log-probs, handed on unchanged
        out = logps(*args, **kwargs)
        captured.append(out[0].detach())
        return out

    trainer._get_per_token_logps_and_entropies = spy
    trainer.importance_sampling_level = level
    try:
        with torch.no_grad():
            trainer._compute_loss(trainer.model, dict(inputs))  # reads the log-probs of these inputs
            batch = dict(inputs, advantages=torch.tensor(ADVANTAGES), old_per_token_logps=captured[0] - delta)
            loss = float(trainer._compute_loss(trainer.model, batch))
    finally:
        del trainer._get_per_token_logps_and_entropies
        trainer.importance_sampling_level = "token"
    return loss, mask, delta


def _by_hand(mask, delta, level):
    """(TRL < 1.10's luspo line, TRL 1.10.0's), from DELTA, ADVANTAGES and the mask alone."""
    advantages = torch.tensor(ADVANTAGES).unsqueeze(1)
    lengths = mask.sum(1, keepdim=True)
    if level == "sequence":
        per_token = -torch.exp((delta * mask).sum(1, keepdim=True) / lengths) * advantages  # (B, 1)
    else:
        per_token = -torch.exp(delta) * advantages  # (B, T): ratios inside the clip range
    return float((per_token * lengths).mean()), float((per_token * mask).sum(-1).mean())


def _check_completions(trainer, mask):
    # the fixed completions (rows in the order TRL shuffled them): 3 tokens then 5 pads, or 8 tokens
    assert sorted(mask.sum(1).tolist()) == [3.0, 3.0, 8.0, 8.0] and mask.size(1) == 8
    assert trainer.current_gradient_accumulation_steps == 1  # the luspo branch's normaliser


@needs_bug
def test_bug_without_the_patch_pad_positions_enter_the_loss(step, unpatched):
    trainer, inputs = step
    with unpatched(PID):
        loss, mask, delta = _loss(trainer, inputs, "token")
    _check_completions(trainer, mask)
    buggy, fixed = _by_hand(mask, delta, "token")
    assert loss == pytest.approx(buggy, rel=1e-5)
    print(f"luspo loss: TRL {loss:.6f}, buggy by hand {buggy:.6f}, TRL 1.10.0 by hand {fixed:.6f}")
    assert abs(buggy - fixed) > 0.1


@needs_trl
def test_the_loss_is_the_masked_sum_per_sequence(step):
    trainer, inputs = step
    loss, mask, delta = _loss(trainer, inputs, "token")
    _check_completions(trainer, mask)
    assert loss == pytest.approx(_by_hand(mask, delta, "token")[1], rel=1e-5)
    assert trainer.loss_type == "luspo" and trainer.max_completion_length == 8  # restored after the call


@needs_trl
def test_the_sequence_level_loss_is_unchanged(step, unpatched):
    trainer, inputs = step
    loss = _loss(trainer, inputs, "sequence")[0]
    with unpatched(PID) if TRL < Version("1.10.0") else contextlib.nullcontext():  # TRL's own luspo line
        before, mask, delta = _loss(trainer, inputs, "sequence")
    buggy, fixed = _by_hand(mask, delta, "sequence")
    assert buggy == pytest.approx(fixed, rel=1e-6)
    assert loss == pytest.approx(before, rel=1e-6) and loss == pytest.approx(fixed, rel=1e-5)


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = lul.probe(module)
    if TRL < Version("1.10.0"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


# -- the wrapper: the two attributes are back after the call, also when TRL raises ----------------------


class _Base:
    max_completion_length = 8  # a class value: the instance's copy goes again


class _Trainer(_Base):
    def __init__(self, loss_type, fail=False):
        self.loss_type, self.fail = loss_type, fail

    def _compute_loss(self, model, inputs):
        if self.fail:
            raise RuntimeError("TRL raised")
        return self.loss_type, self.max_completion_length, model, inputs


@pytest.mark.parametrize("loss_type, seen", [("luspo", ("dr_grpo", 1)), ("dr_grpo", ("dr_grpo", 8)), ("grpo", ("grpo", 8))])
def test_the_wrapper_runs_luspo_as_dr_grpo_of_length_one(loss_type, seen):
    wrapped = lul._wrap_compute_loss(_Trainer._compute_loss)
    trainer = _Trainer(loss_type)
    assert wrapped(trainer, "model", inputs={"x": 1}) == seen + ("model", {"x": 1})
    assert trainer.loss_type == loss_type and "max_completion_length" not in vars(trainer)
    failing = _Trainer("luspo", fail=True)
    with pytest.raises(RuntimeError, match="TRL raised"):
        wrapped(failing, "model", {})
    assert failing.loss_type == "luspo" and "max_completion_length" not in vars(failing)


# -- the probe on code written here: the shape of TRL 0.28 - 1.9's method, and what makes it undecided -----

_METHOD = """
def _compute_loss(self, model, inputs):
    if self.loss_type in ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]:
        per_token_loss = -coef * advantages
    else:
        raise ValueError(f"Unknown loss type: {self.loss_type}")
    if self.loss_type == "dr_grpo":
        loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss / normalizer
    elif self.loss_type == "luspo":
        AGGREGATE
        normalizer = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        loss = loss / normalizer
    if self.loss_type in METRICS:
        clip = self.helper(per_token_loss)
    return loss
"""
_BUGGY = "loss = (per_token_loss * mask.sum(1, keepdim=True)).mean()"


def _written(aggregate=_BUGGY, metrics='["grpo", "bnpo", "dr_grpo", "dapo", "luspo"]', extra="", helper="return x"):
    source = _METHOD.replace("AGGREGATE", aggregate).replace("METRICS", metrics)
    source = source.replace("    return loss\n", extra + "    return loss\n")
    source += f"\ndef helper(self, x):\n    {helper}\n"
    filename = f"<luspo-written-{len(linecache.cache)}-{hash(source)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # so that inspect reads it
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)  # code written here
    cls = type("GRPOTrainer", (), {"_compute_loss": namespace["_compute_loss"], "helper": namespace["helper"]})
    return type("M", (), {"GRPOTrainer": cls})


@pytest.mark.parametrize(
    "module, needed",
    [
        (_written(), True),
        (_written(aggregate="loss = (per_token_loss * mask).sum(-1).mean()"), False),  # TRL 1.10.0
        (_written(aggregate="loss = per_token_loss.mean()"), None),  # an unknown aggregate
        (_written(metrics='["grpo", "bnpo", "dr_grpo", "dapo"]'), None),  # the metrics tell them apart
        (_written(metrics="self.clipped_types"), None),  # a test that cannot be read
        (_written(extra="    kind = self.loss_type\n"), None),  # read other than in a comparison
        (_written(extra="    width = self.max_completion_length\n"), None),  # the length read elsewhere
        (_written(helper="return self.loss_type"), None),  # a helper reads the loss type
        (type("M", (), {"GRPOTrainer": type("GRPOTrainer", (), {})}), None),
    ],
)
def test_probe_on_written_code(module, needed):
    assert lul.probe(module).needed is needed
