"""fused-lm-head-no-triton: TRL 1.15.0 computes every GRPO log-probability with a Triton kernel,
so on a torch without Triton (the CPU wheels, macOS and Windows) every training step fails with
``AttributeError: 'NoneType' object has no attribute 'apply'``, and on a CPU device with Triton
installed the kernel is launched on CPU tensors and fails too.

The bug
    TRL 1.15.0 added ``trl.trainer.utils.add_fused_lm_head``: ``GRPOTrainer.__init__`` calls it on the
    policy (and the reference model), and ``_get_per_token_logps_and_entropies`` then calls the model
    with ``fused_lm_head=True``, whose forward scores the completion tokens through
    ``_ChunkedLogProbFunction.apply(...)``, TRL's ``trl.kernels.ChunkedLogProbFunction``. That
    kernel folds each ``[tokens, vocabulary chunk]`` tile with ``@triton.jit`` kernels, and
    ``trl/kernels/chunked_logprob.py`` imports ``triton`` at its top, so ``trl/trainer/utils.py``
    imports it inside ``try: ... except ImportError: _ChunkedLogProbFunction = None`` ("Triton ships
    with PyTorch on Linux only"). Nothing checks for None before ``.apply``: every GRPO run without
    Triton raises at its first step, whatever its options. With Triton, the kernels are launched
    whatever the device, so a run on the CPU fails in Triton's launcher. TRL 1.16.0 fixed both: its
    ``chunked_logprob.py`` imports ``triton`` only where ``is_triton_available()``, and folds the
    tiles with torch (``_forward_tile`` / ``_backward_tile``) unless ``_use_triton(device)`` (Triton
    available and a CUDA or XPU device), which ``add_fused_lm_head`` consults too. No upstream issue
    or PR names the crash (found by this project's users'-installs sweep: ``pip install trl==1.15.0
    peft`` with the CPU torch); the history read here ends before 1.15, so the change is read from
    the 1.14.2, 1.15.0 and 1.16.0 wheels (the ledger's record ``1.15.0..1.16.0:trl/trainer/utils.py#2``).

How the probe recognises it
    ``trl.trainer.utils`` has no ``add_fused_lm_head``: not needed (log-probs come from the logits,
    TRL up to 1.14.x). Its source consults ``_use_triton``: not needed (1.16.0's fallback). It calls
    ``_ChunkedLogProbFunction.apply(`` and the kernel module's source (read without importing it)
    imports ``triton`` with no ``is_triton_available`` check: needed, said with whether Triton is
    installed. Any other shape: undecided.

The fix
    ``trl.trainer.utils._ChunkedLogProbFunction`` (the name ``add_fused_lm_head`` reads at each call)
    is set, through the Patcher, to a class whose ``apply`` hands the call untouched to TRL's kernel
    when there is one and the hidden states are on a CUDA or XPU device, and otherwise computes the
    same five outputs (log-probs, entropy, ``log(sum p^2)``, mean logit, whether the target is the
    first argmax; those not asked for are None) with torch ops and autograd, as 1.16.0's torch fold
    does: the projection in the autocast dtype (else the hidden states'), the logits in float32,
    scaled by ``logit_scale``, soft-capped, multiplied by ``1 / temperature``. Unlike 1.16 it keeps a
    ``[tokens, vocabulary]`` float32 tile per 4096 tokens for the backward instead of recomputing it:
    the memory of TRL 1.14's unfused path, not 1.16's. The hidden states are read from the call by
    name. Revert sets TRL's value back (None without Triton). Not covered: DeepSpeed ZeRO-3 on a torch
    without Triton (no such cell): TRL's kernel gathers the partitioned head again for its backward,
    autograd here keeps the tensor the forward saw.

Run time: load-bearing: errors propagate (without the fix the step fails anyway).

Delete when: TRL 1.15.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import importlib
import importlib.util

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import code, module_code

PATCH_ID = "fused-lm-head-no-triton"
UTILS = "trl.trainer.utils"
KERNEL_MODULE = "trl.kernels.chunked_logprob"
NAME = "_ChunkedLogProbFunction"
OUTPUTS = ("log_probs", "entropy", "log_sum_sq_probs", "mean_logits", "is_top1")
# tokens per projection, as TRL's TOKEN_CHUNK_SIZE
TOKEN_CHUNK = 4096
KERNEL_DEVICES = ("cuda", "xpu")


def probe(module):
    utils = importlib.import_module(UTILS)
    return judge(utils, lambda: module_code(KERNEL_MODULE))


def judge(utils, kernel_code):
    """The verdict on ``trl.trainer.utils`` (``utils``), reading the kernel module's source through
    ``kernel_code()`` only where it decides."""
    if not hasattr(utils, "add_fused_lm_head"):
        return not_needed("GRPO takes its log-probs from the model's logits (no fused LM head)")
    fused = code(utils.add_fused_lm_head)
    if "_use_triton" in fused:
        return not_needed("add_fused_lm_head uses the Triton kernel only on a CUDA or XPU device with Triton, torch elsewhere")
    if f"{NAME}.apply(" not in fused:
        return undecided(f"add_fused_lm_head does not call {NAME}.apply in a form this patch knows")
    try:
        kernel = kernel_code()
    except Exception as exc:  # noqa: BLE001 - a missing or unreadable kernel module: not the known shape
        return undecided(f"{KERNEL_MODULE} cannot be read ({type(exc).__name__})")
    if "is_triton_available" in kernel or "import triton" not in kernel:
        return undecided(f"{KERNEL_MODULE} does not import triton unconditionally: a shape this patch does not know")
    if importlib.util.find_spec("triton") is None:
        return needed(f"every GRPO step calls {NAME}.apply, and triton is not installed: {NAME} is None")
    return needed(f"every GRPO step calls {NAME}.apply, which launches Triton kernels on any device: a CPU run fails")


def chunked_log_probs(
    hidden,
    weight,
    bias,
    targets,
    temperature,
    chunk_size,
    final_logit_softcapping=None,
    logit_scale=1.0,
    outputs=OUTPUTS[1:],
):
    """TRL 1.15's ``ChunkedLogProbFunction.apply`` in torch (``chunk_size``, the kernel's vocabulary
    tile, changes nothing here): ``(log_probs, entropy, log_sum_sq_probs, mean_logits, is_top1)``
    per row of ``hidden``, each extra one None unless named in ``outputs``."""
    import torch

    device = hidden.device
    autocast = torch.is_autocast_enabled(device.type)
    compute_dtype = torch.get_autocast_dtype(device.type) if autocast else hidden.dtype
    pieces: dict[str, list] = {name: [] for name in OUTPUTS}
    # no row at all (every label masked): one empty tile, so the outputs stay connected to the model
    for start in range(0, hidden.shape[0], TOKEN_CHUNK) or [0]:
        logits = hidden[start : start + TOKEN_CHUNK].to(compute_dtype) @ weight.to(compute_dtype).t()
        if bias is not None:
            logits = logits + bias.to(compute_dtype)
        z = logits.float() * logit_scale
        if final_logit_softcapping is not None:
            z = final_logit_softcapping * torch.tanh(z / final_logit_softcapping)
        z = z * (1 / temperature)
        log_p = torch.log_softmax(z, dim=-1)
        chunk_targets = targets[start : start + TOKEN_CHUNK]
        pieces["log_probs"].append(log_p.gather(-1, chunk_targets.unsqueeze(-1)).squeeze(-1))
        if "entropy" in outputs:  # -sum p log p: no cancellation between log Z and the mean logit
            pieces["entropy"].append(-(log_p.exp() * log_p).sum(-1))
        with torch.no_grad():  # TRL's kernel marks these three non-differentiable
            if "log_sum_sq_probs" in outputs:
                pieces["log_sum_sq_probs"].append(torch.logsumexp(2 * log_p, dim=-1))
            if "mean_logits" in outputs:
                pieces["mean_logits"].append(z.sum(-1) / z.shape[-1])
            if "is_top1" in outputs:
                pieces["is_top1"].append(z.argmax(-1) == chunk_targets)  # the first maximum, as TRL's kernel
    return tuple(torch.cat(pieces[name]) if pieces[name] else None for name in OUTPUTS)


def make_dispatch(kernel):
    """What ``_ChunkedLogProbFunction`` becomes: TRL's ``kernel`` (None without Triton) where it can
    run, :func:`chunked_log_probs` elsewhere."""

    class ChunkedLogProbFunction:
        @staticmethod
        def apply(*args, **kwargs):
            hidden = arguments(chunked_log_probs, *args, **kwargs).get("hidden")
            device = getattr(getattr(hidden, "device", None), "type", None)
            if kernel is not None and device in KERNEL_DEVICES:
                return kernel.apply(*args, **kwargs)
            return chunked_log_probs(*args, **kwargs)

    ChunkedLogProbFunction.__qualname__ = f"trl_compat.{PATCH_ID}.ChunkedLogProbFunction"
    return ChunkedLogProbFunction


def apply(module, patcher):
    utils = importlib.import_module(UTILS)
    patcher.replace(utils, NAME, make_dispatch(getattr(utils, NAME)))
