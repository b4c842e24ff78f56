"""kl-bias-correction-sequence: use_bias_correction_kl put the sequence ratio on the per-token KL (TRL 0.26.0+).

* A real tiny GRPO step with ``beta=0.5``, ``importance_sampling_level="sequence"``, ``num_iterations=2``,
  ``loss_type="grpo"`` and ``use_bias_correction_kl=True``; its inputs are kept and TRL's
  ``GRPOTrainer._compute_loss`` is called again on them, the model's log-probs ``P`` handed to TRL as a
  leaf tensor (their own values: the gradient with respect to them is the loss's gradient up to the
  model's Jacobian), with fixed advantages, ``old_per_token_logps = P - DELTA`` (per-token log-ratios that
  vary along each row, as after an optimizer step of the same generation batch) and
  ``ref_per_token_logps = P + GAMMA``.
* By hand (the grpo aggregate: per-sequence masked mean, then the batch mean): the policy term with the
  sequence ratio ``c_b = exp(mean_t DELTA)``, the k3 KL ``exp(GAMMA) - GAMMA - 1`` multiplied by
  ``exp(DELTA)`` (PR #7188, the fix) or by ``c_b`` (TRL's line). The patched loss and its gradient equal
  the first, the unpatched ones the second, and the two differ. The token level is the same with and
  without the patch (and by hand). With ``loss_type="luspo"`` (TRL 0.28+; luspo-unmasked-loss stacked below
  on 0.28 - 1.9) the loss is TRL 1.10.0's luspo aggregate of the per-token-corrected KL. The attributes
  the fix swaps are back after the call; the probe on the cell's TRL and on code written here.
"""

import linecache

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import kl_bias_correction_sequence as kbc

from packaging.version import Version

from cells import only_in_cells
from versions import installed

PID = "kl-bias-correction-sequence"
TRL = installed("trl")
BETA = 0.5

# the real step (about 16 s a cell): the first release of the bug, luspo-unmasked-loss stacked below (1.9.2),
# the newest; the lines the patch corrects are the same in every release between (the probe runs in each)
by_value = only_in_cells(
    "trl0.26.0-tf4.57.3", "trl1.9.2-tf5.14.1-ds0.19.3", "trl-newest", why="one real GRPO step per shape of the loss"
)
needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.26.0"), reason=f"TRL {TRL}: no use_bias_correction_kl before 0.26.0")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


@pytest.fixture(scope="module")
def step(tmp_path_factory):
    """A trainer after one real step (beta > 0, sequence level, two iterations), and the inputs of its loss call."""
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path_factory.mktemp("klseq"),
        steps=1,
        beta=BETA,
        importance_sampling_level="sequence",
        num_iterations=2,
        loss_type="grpo",
        use_bias_correction_kl=True,
    )
    assert not {"beta", "importance_sampling_level", "num_iterations", "use_bias_correction_kl"} & set(
        trainer.tiny_dropped_config_keys
    )
    seen = grpo_run.spy_loss_inputs(trainer)
    trainer.train()
    assert len(seen) == 1
    inputs = seen[0]
    assert inputs.get("old_per_token_logps") is not None and inputs.get("ref_per_token_logps") is not None
    assert trainer.current_gradient_accumulation_steps == 1 and trainer.model.training
    return trainer, inputs


def _patterns(mask):
    rows, width = mask.shape
    t = torch.arange(width, dtype=torch.float32).expand(rows, width)
    b = torch.arange(rows, dtype=torch.float32).unsqueeze(1).expand(rows, width)
    delta = 0.15 * ((t % 3) - 1) + 0.01 * (b - 1.5)  # log pi - log pi_old: varies along each row, inside the clip range
    gamma = (((t + b) % 4) - 1.5) / 1.5  # log pi_ref - log pi
    advantages = torch.tensor([1.0, -0.5, 2.0, -1.5][:rows] + [0.5] * max(0, rows - 4))
    return delta, gamma, advantages


def _trl_loss(trainer, inputs, level):
    """TRL's loss and its gradient with respect to the log-probs ``P`` (a leaf with the model's values)."""
    logps = trainer._get_per_token_logps_and_entropies
    values = []
    leaf = []

    def spy(*args, **kwargs):
        out = logps(*args, **kwargs)
        if not values:  # the first call reads the model's log-probs of these inputs
            values.append(out[0].detach())
            return out
        leaf.append(values[0].clone().requires_grad_(True))
        return (leaf[0], *out[1:])

    trainer._get_per_token_logps_and_entropies = spy
    trainer.importance_sampling_level = level
    try:
        with torch.no_grad():
            trainer._compute_loss(trainer.model, dict(inputs))
        mask = inputs["completion_mask"].float()
        delta, gamma, advantages = _patterns(mask)
        batch = dict(inputs, advantages=advantages, old_per_token_logps=values[0] - delta, ref_per_token_logps=values[0] + gamma)
        loss = trainer._compute_loss(trainer.model, batch)
        (grad,) = torch.autograd.grad(loss, leaf[0])
    finally:
        del trainer._get_per_token_logps_and_entropies
        trainer.importance_sampling_level = "sequence"
    return float(loss), grad, values[0], mask


def _by_hand(trainer, logps, mask, level, kl_ratio, aggregate="grpo"):
    """The grpo loss and its gradient by hand; ``kl_ratio``: "token" (the fix) or "policy" (TRL's coef_1)."""
    delta, gamma, advantages = _patterns(mask)
    p = logps.clone().requires_grad_(True)
    old, ref = logps - delta, logps + gamma
    log_ratio = p - old
    if level == "sequence":
        coef_1 = torch.exp((log_ratio * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0))
    else:
        coef_1 = torch.exp(log_ratio)
    a = advantages.unsqueeze(1)
    coef_2 = torch.clamp(coef_1, 1 - trainer.epsilon_low, 1 + trainer.epsilon_high)
    policy = -torch.min(coef_1 * a, coef_2 * a)
    k3 = torch.exp(ref - p) - (ref - p) - 1
    kl = k3 * (torch.exp(log_ratio) if kl_ratio == "token" else coef_1)
    per_token = policy + BETA * kl
    if aggregate == "luspo":  # TRL 1.10.0's line (luspo-unmasked-loss before it)
        loss = (per_token * mask).sum(-1).mean()
    else:
        loss = ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    (grad,) = torch.autograd.grad(loss, p)
    return float(loss), grad


@needs_trl
@by_value
def test_bug_without_the_patch_the_kl_gets_the_sequence_ratio(step, unpatched):
    trainer, inputs = step
    with unpatched(PID):
        loss, grad, logps, mask = _trl_loss(trainer, inputs, "sequence")
    buggy_loss, buggy_grad = _by_hand(trainer, logps, mask, "sequence", "policy")
    fixed_loss, fixed_grad = _by_hand(trainer, logps, mask, "sequence", "token")
    assert loss == pytest.approx(buggy_loss, rel=1e-5)
    torch.testing.assert_close(grad, buggy_grad, rtol=1e-4, atol=1e-7)
    print(f"sequence level, TRL's loss {loss:.7f}: by hand with coef_1 {buggy_loss:.7f}, with the per-token ratio {fixed_loss:.7f}")
    print(f"gradient: |TRL - per-token| max {float((grad - fixed_grad).abs().max()):.3e} (|grad| max {float(grad.abs().max()):.3e})")
    assert abs(buggy_loss - fixed_loss) > 1e-4
    assert float((buggy_grad - fixed_grad).abs().max()) > 1e-3


@needs_trl
@by_value
def test_the_kl_is_multiplied_by_the_per_token_ratio(step):
    trainer, inputs = step
    loss, grad, logps, mask = _trl_loss(trainer, inputs, "sequence")
    fixed_loss, fixed_grad = _by_hand(trainer, logps, mask, "sequence", "token")
    buggy_loss, buggy_grad = _by_hand(trainer, logps, mask, "sequence", "policy")
    print(f"sequence level, patched loss {loss:.7f}: per-token by hand {fixed_loss:.7f}, coef_1 by hand {buggy_loss:.7f}")
    assert loss == pytest.approx(fixed_loss, rel=1e-5)
    torch.testing.assert_close(grad, fixed_grad, rtol=1e-4, atol=1e-7)
    assert float((grad - buggy_grad).abs().max()) > 1e-3
    # restored after the call
    assert type(trainer.beta) is float and trainer.beta == BETA and trainer.args.use_bias_correction_kl is True
    assert kbc.LOGPS not in vars(trainer)


@pytest.mark.skipif(TRL is None or TRL < Version("0.28.0"), reason=f"TRL {TRL}: no luspo loss before 0.28.0")
@by_value
def test_stacked_with_the_luspo_loss(step):
    """loss_type="luspo" (luspo-unmasked-loss below this patch on TRL 0.28 - 1.9): both fixes hold in one call."""
    trainer, inputs = step
    trainer.loss_type = "luspo"
    try:
        loss, grad, logps, mask = _trl_loss(trainer, inputs, "sequence")
    finally:
        trainer.loss_type = "grpo"
    fixed_loss, fixed_grad = _by_hand(trainer, logps, mask, "sequence", "token", aggregate="luspo")
    buggy_loss = _by_hand(trainer, logps, mask, "sequence", "policy", aggregate="luspo")[0]
    print(f"luspo, sequence level, patched loss {loss:.7f}: per-token by hand {fixed_loss:.7f}, coef_1 by hand {buggy_loss:.7f}")
    assert loss == pytest.approx(fixed_loss, rel=1e-5)
    torch.testing.assert_close(grad, fixed_grad, rtol=1e-4, atol=1e-7)
    assert abs(fixed_loss - buggy_loss) > 1e-4


@needs_trl
@by_value
def test_the_token_level_is_unchanged(step, unpatched):
    trainer, inputs = step
    loss, grad, logps, mask = _trl_loss(trainer, inputs, "token")
    with unpatched(PID):
        before, before_grad, _, _ = _trl_loss(trainer, inputs, "token")
    by_hand, by_hand_grad = _by_hand(trainer, logps, mask, "token", "token")
    assert loss == before and torch.equal(grad, before_grad)
    assert loss == pytest.approx(by_hand, rel=1e-5)
    torch.testing.assert_close(grad, by_hand_grad, rtol=1e-4, atol=1e-7)


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = kbc.probe(module)
    assert verdict.needed is True, verdict  # open upstream: every release from 0.26.0 has the line


# -- the wrapper: what it swaps is back after the call, also when TRL raises; untouched where not affected -----


class _Args:
    def __init__(self, flag):
        self.use_bias_correction_kl = flag


class _Trainer:
    def __init__(self, beta=0.1, level="sequence", flag=True, fail=False):
        self.beta, self.importance_sampling_level, self.args, self.fail = beta, level, _Args(flag), fail

    def _get_per_token_logps_and_entropies(self, model, x):
        return x * 2.0, None

    def _compute_loss(self, model, inputs):
        logps = self._get_per_token_logps_and_entropies(model, inputs["x"])[0]
        if self.fail:
            raise RuntimeError("TRL raised")
        kl = torch.ones_like(logps)
        return self.beta * kl, self.beta != 0.0, self.args.use_bias_correction_kl


def test_the_wrapper_weights_the_kl_by_the_per_token_ratio_and_restores():
    wrapped = kbc._wrap_compute_loss(_Trainer._compute_loss)
    x = torch.tensor([[0.1, 0.2, 0.3]])
    old = torch.tensor([[0.0, 0.5, 0.6]])
    trainer = _Trainer()
    kl, nonzero, flag = wrapped(trainer, "model", inputs={"x": x, "old_per_token_logps": old})
    torch.testing.assert_close(kl, 0.1 * torch.exp(2.0 * x - old))
    assert nonzero is True and flag is False
    assert (
        type(trainer.beta) is float
        and trainer.args.use_bias_correction_kl is True
        and vars(trainer).keys()
        == {
            "beta",
            "importance_sampling_level",
            "args",
            "fail",
        }
    )
    # no old log-probs: TRL's per_token_logps.detach(): the ratio's value is 1
    kl = wrapped(trainer, "model", {"x": x})[0]
    torch.testing.assert_close(kl, torch.full_like(x, 0.1))
    failing = _Trainer(fail=True)
    with pytest.raises(RuntimeError, match="TRL raised"):
        wrapped(failing, "model", {"x": x})
    assert type(failing.beta) is float and failing.args.use_bias_correction_kl is True
    assert kbc.LOGPS not in vars(failing)


@pytest.mark.parametrize("kwargs", [dict(level="token"), dict(beta=0.0), dict(flag=False)])
def test_the_wrapper_leaves_other_calls_alone(kwargs):
    wrapped = kbc._wrap_compute_loss(_Trainer._compute_loss)
    kl, _, flag = wrapped(_Trainer(**kwargs), "model", {"x": torch.tensor([[0.1]]), "old_per_token_logps": torch.tensor([[0.5]])})
    assert flag is kwargs.get("flag", True)
    torch.testing.assert_close(kl, torch.full((1, 1), kwargs.get("beta", 0.1)))


def test_the_weight_is_beta_elsewhere():
    weight = kbc.PerTokenKLWeight(0.25, lambda: torch.tensor([2.0]))
    assert weight != 0.0 and weight == 0.25 and weight * 2 == 0.5 and 2 * weight == 0.5
    torch.testing.assert_close(weight * torch.tensor([3.0]), torch.tensor([1.5]))


# -- the probe on code written here: the shape of TRL 0.26 - 1.16's method, the fix, what makes it undecided -----

_METHOD = """
def _compute_loss(self, model, inputs):
    per_token_logps, entropies = self._get_per_token_logps_and_entropies(model, inputs)
    old_per_token_logps = inputs.get("old_per_token_logps")
    old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps
    log_ratio = per_token_logps - old_per_token_logps
    if self.importance_sampling_level == "token":
        log_importance_weights = log_ratio
    elif self.importance_sampling_level == "sequence":
        log_importance_weights = (log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        log_importance_weights = SEQUENCE
    coef_1 = torch.exp(log_importance_weights)
    if self.beta != 0.0:
        per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
        if self.args.use_bias_correction_kl:
            per_token_kl = per_token_kl * FACTOR
    per_token_loss = -coef_1 * advantages
    if self.beta != 0.0:
        per_token_loss = PRODUCT
    EXTRA
    return self.helper(per_token_loss)
"""


def _written(
    factor="coef_1",
    sequence="log_importance_weights.unsqueeze(-1)",
    product="per_token_loss + self.beta * per_token_kl",
    extra="pass",
    helper="return x",
    flag=True,
):
    source = _METHOD.replace("FACTOR", factor).replace("SEQUENCE", sequence).replace("PRODUCT", product)
    source = source.replace("EXTRA", extra)
    if not flag:
        source = source.replace("self.args.use_bias_correction_kl", "self.args.other_flag")
    source += f"\ndef helper(self, x):\n    {helper}\n"
    source += "\ndef _get_per_token_logps_and_entropies(self, model, inputs):\n    return inputs, None\n"
    filename = f"<klseq-written-{len(linecache.cache)}-{hash(source)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # so that inspect reads it
    namespace = {}
    exec(compile(source, filename, "exec"), namespace)  # code written here
    methods = ("_compute_loss", "helper", "_get_per_token_logps_and_entropies")
    cls = type("GRPOTrainer", (), {name: namespace[name] for name in methods})
    return type("M", (), {"GRPOTrainer": cls})


@pytest.mark.parametrize(
    "module, needed",
    [
        (_written(), True),  # TRL 0.26.0 - 1.16.0
        (_written(factor="torch.exp(log_ratio)"), False),  # PR #7188
        (_written(factor="ratio", extra="ratio = torch.exp(log_ratio)"), False),  # a name bound to the per-token ratio
        (_written(flag=False), False),  # before PR #4638
        (_written(factor="coef_2"), None),  # an unknown ratio
        (_written(sequence="log_importance_weights"), None),  # the sequence weight is not (B, 1)
        (_written(product="per_token_loss + per_token_kl * self.beta"), None),  # the product the fix hooks is not there
        (_written(extra="scale = self.beta * 2"), None),  # beta read elsewhere
        (_written(extra="use = self.args.use_bias_correction_kl"), None),  # the flag read twice
        (_written(helper="return self.beta * x"), None),  # a helper reads beta
        (type("M", (), {"GRPOTrainer": type("GRPOTrainer", (), {})}), None),
    ],
)
def test_probe_on_written_code(module, needed):
    assert kbc.probe(module).needed is needed
