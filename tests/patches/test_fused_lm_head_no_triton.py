"""fused-lm-head-no-triton: TRL 1.15.0's fused LM head calls a Triton-only kernel (None without Triton;
fixed in 1.16.0).

* The TRL 1.15.0 cell (a user's install with the CPU torch: no Triton), without the patch: a tiny GRPO
  run fails at its first step with ``'NoneType' object has no attribute 'apply'``.
* With it: the run trains, and the fused forward's per-token log-probs and entropies equal
  ``log_softmax`` of the model's own logits divided by the temperature, at the labels (1e-5), with the
  same gradients; a microbatch without one valid label still backpropagates (a zero).
* The torch computation against a direct one (logit scale, soft-cap, bias, ties for ``is_top1``), and
  the dispatch: TRL's kernel gets the call untouched on a CUDA tensor, never on a CPU one.
* The probe on the cell's TRL and on code written as 1.14.2, 1.15.0 and 1.16.0 write it.
"""

import importlib.util
from types import SimpleNamespace

import trl_compat
from trl_compat.patches import fused_lm_head_no_triton as patch_module

import pytest
from packaging.version import Version

from versions import installed

PATCH_ID = "fused-lm-head-no-triton"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("1.15.0") <= TRL < Version("1.16.0")
needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"TRL 1.15.x only (the trl1.15.0-tf5.24.0-user cell; here trl {TRL})")
TEMPERATURE = 0.7


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


# -- the probe ---------------------------------------------------------------------------------

UTILS_1_14 = "def selective_log_softmax(logits, index):\n    return logits\n"
UTILS_1_15 = """
def add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs",)):
    per_token = _ChunkedLogProbFunction.apply(hidden, weight, bias, labels, temperature, 4096)
"""
UTILS_1_16 = """
def add_fused_lm_head(model, temperature=1.0, cast_lm_head_to_fp32=False, outputs=("log_probs",)):
    compact = _use_triton(hidden_states.device)
    per_token = _ChunkedLogProbFunction.apply(hidden, weight, bias, labels, temperature, 4096)
"""
UTILS_OTHER = """
def add_fused_lm_head(model, temperature=1.0):
    per_token = chunked_logprobs(hidden, weight, labels)
"""
KERNEL_1_15 = "import torch\nimport triton\nimport triton.language as tl\n"
KERNEL_1_16 = "import torch\nfrom transformers.utils import is_triton_available\nif is_triton_available():\n    import triton\n"


@pytest.mark.parametrize(
    "utils, kernel, verdict",
    [
        (UTILS_1_14, KERNEL_1_15, False),
        (UTILS_1_15, KERNEL_1_15, True),
        (UTILS_1_16, KERNEL_1_16, False),
        (UTILS_1_15, KERNEL_1_16, None),
        (UTILS_OTHER, KERNEL_1_15, None),
    ],
    ids=["1.14.2", "1.15.0", "1.16.0", "unknown-kernel", "unknown-call"],
)
def test_probe_on_written_code(code_module, utils, kernel, verdict):
    from trl_compat._helpers.source import Code, normalise

    assert patch_module.judge(code_module(utils), lambda: Code(normalise(kernel))).needed is verdict


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    verdict = patch_module.probe(grpo)
    assert verdict.needed is AFFECTED, verdict
    assert trl_compat.status(PATCH_ID) == (trl_compat.APPLIED if AFFECTED else trl_compat.NOT_NEEDED), trl_compat.report()


# -- the torch computation and the dispatch ------------------------------------------------------


def reference(hidden, weight, bias, targets, temperature, softcap=None, scale=1.0):
    import torch

    z = hidden.double() @ weight.double().t() + (0 if bias is None else bias.double())
    z = z * scale
    if softcap is not None:
        z = softcap * torch.tanh(z / softcap)
    z = z / temperature
    log_p = torch.log_softmax(z, -1)
    p = log_p.exp()
    return {
        "log_probs": log_p.gather(-1, targets[:, None])[:, 0],
        "entropy": -(p * log_p).sum(-1),
        "log_sum_sq_probs": torch.log((p * p).sum(-1)),
        "mean_logits": z.mean(-1),
    }


@pytest.mark.parametrize("softcap, scale, with_bias", [(None, 1.0, False), (3.0, 0.5, True)], ids=["plain", "softcap-scale-bias"])
def test_torch_computation_matches_log_softmax(softcap, scale, with_bias):
    torch = pytest.importorskip("torch")
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(7, 16, generator=generator, requires_grad=True)
    weight = torch.randn(50, 16, generator=generator, requires_grad=True)
    bias = torch.randn(50, generator=generator) if with_bias else None
    targets = torch.randint(0, 50, (7,), generator=generator)
    got = patch_module.chunked_log_probs(hidden, weight, bias, targets, TEMPERATURE, 4096, softcap, scale, patch_module.OUTPUTS)
    want = reference(hidden, weight, bias, targets, TEMPERATURE, softcap, scale)
    for name, value in zip(patch_module.OUTPUTS, got):
        if name in want:
            torch.testing.assert_close(value.double(), want[name], atol=1e-5, rtol=1e-5, msg=name)
    assert not any(t.requires_grad for t in got[2:])  # non-differentiable, as TRL's kernel marks them
    (got[0].sum() + got[1].sum()).backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    (want["log_probs"].sum() + want["entropy"].sum()).backward()
    torch.testing.assert_close(grads[0].double(), hidden.grad.double(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1].double(), weight.grad.double(), atol=1e-5, rtol=1e-5)


def test_is_top1_is_the_first_maximum_and_unasked_outputs_are_none():
    torch = pytest.importorskip("torch")
    weight = torch.eye(4)
    hidden = torch.tensor([[1.0, 3.0, 3.0, 0.0], [1.0, 3.0, 3.0, 0.0], [0.0, 0.0, 0.0, 5.0]])
    targets = torch.tensor([1, 2, 0])  # a tie won by the earlier token; a tie lost; not the maximum
    got = patch_module.chunked_log_probs(hidden, weight, None, targets, 1.0, 4096, outputs=("is_top1",))
    log_probs, entropy, log_sum_sq, mean, top1 = got
    assert top1.tolist() == [True, False, False]
    assert entropy is None and log_sum_sq is None and mean is None
    assert log_probs.shape == (3,)


def test_no_row_stays_connected_to_the_weights():
    torch = pytest.importorskip("torch")
    weight = torch.randn(10, 4, requires_grad=True)
    no_targets = torch.zeros(0, dtype=torch.long)
    log_probs, entropy, *_ = patch_module.chunked_log_probs(torch.zeros(0, 4), weight, None, no_targets, 1.0, 4096)
    assert log_probs.shape == (0,) and log_probs.grad_fn is not None
    log_probs.sum().backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


class RecordingKernel:
    calls: list = []

    @staticmethod
    def apply(*args, **kwargs):
        RecordingKernel.calls.append((args, kwargs))
        return "kernel's answer"


def test_dispatch_hands_cuda_calls_to_the_kernel_untouched():
    RecordingKernel.calls = []
    dispatch = patch_module.make_dispatch(RecordingKernel)
    hidden = SimpleNamespace(device=SimpleNamespace(type="cuda"))
    assert dispatch.apply(hidden, "weight", None, "targets", 0.5, 4096, None, 1.0, ("log_probs",)) == "kernel's answer"
    assert RecordingKernel.calls == [((hidden, "weight", None, "targets", 0.5, 4096, None, 1.0, ("log_probs",)), {})]
    assert dispatch.apply(hidden=hidden, weight="w", bias=None, targets="t", temperature=1.0, chunk_size=8) == "kernel's answer"
    assert RecordingKernel.calls[-1][1]["hidden"] is hidden  # bound by name


def test_dispatch_computes_cpu_calls_in_torch():
    torch = pytest.importorskip("torch")
    RecordingKernel.calls = []
    hidden, weight, targets = torch.randn(3, 4), torch.randn(6, 4), torch.tensor([0, 5, 2])
    for kernel in (RecordingKernel, None):
        got = patch_module.make_dispatch(kernel).apply(hidden, weight, None, targets, 1.0, 4096)
        torch.testing.assert_close(got[0], patch_module.chunked_log_probs(hidden, weight, None, targets, 1.0, 4096)[0])
    assert RecordingKernel.calls == []


# -- real GRPO runs on TRL 1.15.0 --------------------------------------------------------------


@needs_affected
def test_the_cell_has_no_triton():
    assert importlib.util.find_spec("triton") is None  # the cell stands for the CPU, macOS and Windows wheels


@needs_affected
def test_first_step_fails_without_patch(tmp_path, unpatched):
    import trl.trainer.utils as utils

    import grpo_run

    with unpatched(PATCH_ID):
        assert utils._ChunkedLogProbFunction is None
        trainer = grpo_run.make_trainer(tmp_path, steps=1)
        with pytest.raises(AttributeError, match="'NoneType' object has no attribute 'apply'"):
            trainer.train()


@needs_affected
def test_trains_with_patch(tmp_path):
    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    trainer = grpo_run.make_trainer(tmp_path, steps=3)
    before = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert grpo_run.changed_trainable(trainer, before)


@needs_affected
def test_fused_forward_equals_the_logits_log_softmax(tmp_path):
    import torch

    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, steps=1, temperature=TEMPERATURE)
    model = trainer.model
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=generator)
    labels = ids.clone()
    labels[0, :4] = -100  # a prompt's positions, as TRL masks them
    fused = model(input_ids=ids, labels=labels, fused_lm_head=True)
    fused_loss = fused.log_probs.sum() + fused.entropy.sum()
    fused_loss.backward()
    fused_grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    logits = model(input_ids=ids).logits[:, :-1].float() / TEMPERATURE
    log_p = torch.log_softmax(logits, -1)
    mask = labels[:, 1:] != -100
    want = log_p.gather(-1, labels[:, 1:].clamp(min=0)[..., None])[..., 0] * mask
    want_entropy = -(log_p.exp() * log_p).sum(-1) * mask
    torch.testing.assert_close(fused.log_probs, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fused.entropy, want_entropy, atol=1e-5, rtol=1e-5)
    (want.sum() + want_entropy.sum()).backward()
    assert fused_grads and set(fused_grads) == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, grad in fused_grads.items():
        torch.testing.assert_close(grad, dict(model.named_parameters())[name].grad, atol=1e-5, rtol=1e-4, msg=name)


@needs_affected
def test_a_microbatch_without_labels_backpropagates_a_zero(tmp_path):
    import torch

    import grpo_run

    model = grpo_run.make_trainer(tmp_path, steps=1).model
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    out = model(input_ids=ids, labels=torch.full_like(ids, -100), fused_lm_head=True)
    out.log_probs.sum().backward()
    assert torch.equal(out.log_probs, torch.zeros(1, 5))
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters() if p.grad is not None)
