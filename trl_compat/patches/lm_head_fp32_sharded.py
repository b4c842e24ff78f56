"""lm-head-fp32-sharded: ``cast_lm_head_to_fp32=True`` under DeepSpeed ZeRO-3 or FSDP with bf16 crashes at
the first generation (or log-prob forward): the fp32 head is handed bf16 weights.

The bug
    ``cast_lm_head_to_fp32`` (PR #4303, ``41c8ca1ad``, first released in 0.25.0; tied embeddings from
    PR #4446, ``d9f9e2b1a``) makes the LM head of the policy and of the reference model fp32 in
    ``GRPOTrainer.__init__``: ``target_model.lm_head = target_model.lm_head.float()``, and a forward
    pre-hook, ``cast_inputs_to_fp32``, casts the hidden states to fp32. That holds only while the head's
    weight stays the fp32 tensor ``.float()`` made. Under ZeRO-3 the model is loaded partitioned
    (``zero.Init``): ``.float()`` turns each parameter's empty placeholder to fp32, but its shard
    (``ds_tensor``) stays bf16 and every gather hands the head a bf16 weight again. Under FSDP2 (and
    FSDP1) with mixed precision the all-gather casts the weight to the compute dtype, bf16. The head then
    multiplies fp32 hidden states by a bf16 weight: ``RuntimeError: expected m1 and m2 to have the same
    dtype, but got: float != c10::BFloat16``. Under ZeRO-3 that is the first generation of the first
    step (the whole model gathered for it; the per-module fetch of the log-prob forwards gathers the same
    bf16 shard), under FSDP the first forward of the sharded model (fp16 would gather the same way,
    ``float != c10::Half``; not run here). In fp32 training nothing goes wrong: the gathered weight is
    fp32 there. A real 2-process ZeRO-3 run on the CPU (gloo, bf16) shows it on TRL 1.0.0 with DeepSpeed
    0.19.2, and a 2-process FSDP2 forward (``fully_shard`` with ``MixedPrecisionPolicy(param_dtype=bf16)``)
    the same error.
    Upstream: PR #6330 (main-branch commit ``7eaaf64a5``, first released in 1.9.0) replaces the head's
    ``forward`` by ``nn.functional.linear(hidden_states.to(torch.float32),
    lm_head.weight.to(torch.float32), bias.to(torch.float32))``, which casts whatever weight the gather
    hands it, and raises ``ValueError`` for an LM head that carries a PEFT adapter.

How the probe recognises it
    ``GRPOTrainer.__init__`` (comments dropped) registers ``cast_inputs_to_fp32`` as a forward pre-hook
    on the head it made fp32 with ``lm_head.float()`` (0.25.0 - 1.8.x; the first 0.25.0.dev0 builds
    too): needed. It sets ``lm_head.forward = cast_forward_to_fp32`` (PR #6330), or has no
    ``cast_lm_head_to_fp32`` at all (TRL < 0.25): not needed. Anything else: undecided.

The fix
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``). After TRL's ``__init__``, with
    ``cast_lm_head_to_fp32`` on, every module of the policy and of the reference model (through its
    DeepSpeed or FSDP wrapper) that carries TRL's ``cast_inputs_to_fp32`` pre-hook and is a plain
    ``nn.Linear`` gets PR #6330's forward, bound to the module (so that a copy of the model computes
    with its own weights): ``F.linear(input.float(), weight.float(), bias.float())``. Where the weight is
    fp32 already (one process, DDP) this is the very computation TRL's hook and ``nn.Linear`` made, bit
    for bit; where a gather hands it bf16, the head computes in fp32 instead of crashing. TRL's hook
    stays (it casts the input to fp32 once more). A head that is not a plain ``nn.Linear`` (a PEFT
    adapter on ``lm_head``, which TRL 1.9 refuses) is left as TRL made it, with a warning.

Run time: load-bearing: errors propagate. The new forward is the fix itself: falling back to TRL's head
on an error would be the crash again (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.25.0 - 1.8.x (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import logging
import types

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "lm-head-fp32-sharded"
HOOK = "cast_inputs_to_fp32"  # TRL's pre-hook's name, 0.25.0 - 1.8.x
_OPTION = "if args.cast_lm_head_to_fp32:"
_BUGGY = f"lm_head.register_forward_pre_hook({HOOK})"
_FLOAT = "lm_head = target_model.lm_head.float()"  # 0.25.0 - 1.8.x; the first 0.25.0.dev0 builds: model.lm_head
_FLOAT_FIRST = "model.lm_head = model.lm_head.float()"
_FIXED = "lm_head.forward = cast_forward_to_fp32"  # PR #6330


def probe(module):
    body = code(module.GRPOTrainer.__init__)
    if _FIXED in body:
        return not_needed("GRPOTrainer casts the LM head's weight to fp32 in its forward (fixed code)")
    if _OPTION not in body:
        return not_needed("GRPOTrainer has no cast_lm_head_to_fp32 (TRL < 0.25)")
    if _BUGGY in body and (_FLOAT in body or _FLOAT_FIRST in body):
        return needed(
            "cast_lm_head_to_fp32 makes the LM head fp32 once and casts only its input: under ZeRO-3 or FSDP with "
            "bf16 the gathered weight is bf16 again (float != c10::BFloat16)"
        )
    return undecided("GRPOTrainer casts the LM head to fp32 in a way this patch does not know")


def fp32_forward(self, input):
    """PR #6330's LM head forward, bound to the head: input, weight and bias cast to fp32 at call time."""
    import torch

    bias = self.bias
    return torch.nn.functional.linear(
        input.to(torch.float32), self.weight.to(torch.float32), None if bias is None else bias.to(torch.float32)
    )


def _is_trls_hook(hook, module_name: str) -> bool:
    hook = getattr(hook, "__func__", hook)
    return getattr(hook, "__name__", None) == HOOK and getattr(hook, "__module__", None) == module_name


def cast_heads(model, module_name: str) -> tuple[int, list[str]]:
    """Give every module of ``model`` that carries TRL's ``cast_inputs_to_fp32`` pre-hook the fp32 forward;
    returns how many got it and the class names of the hooked modules left alone (not a plain ``nn.Linear``)."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return 0, []
    fixed, skipped = 0, []
    for submodule in model.modules():
        hooks = getattr(submodule, "_forward_pre_hooks", None) or {}
        if not any(_is_trls_hook(hook, module_name) for hook in hooks.values()):
            continue
        current = vars(submodule).get("forward")
        if current is not None and getattr(current, "__func__", None) is fp32_forward:
            continue  # done already (a reference model that is the policy's module)
        if not isinstance(submodule, torch.nn.Linear) or type(submodule).forward is not torch.nn.Linear.forward or current:
            skipped.append(type(submodule).__name__)
            continue
        submodule.forward = types.MethodType(fp32_forward, submodule)
        fixed += 1
    return fixed, skipped


def _after(trainer, arguments, module_name: str) -> None:
    args = getattr(trainer, "args", None)
    if not getattr(args, "cast_lm_head_to_fp32", False):
        return
    skipped: list[str] = []
    for model in (getattr(trainer, "model", None), getattr(trainer, "ref_model", None)):
        skipped += cast_heads(model, module_name)[1]
    if skipped:
        log.warning(
            "trl_compat: %s: cast_lm_head_to_fp32 on an LM head that is not a plain nn.Linear (%s, e.g. a PEFT adapter "
            "on lm_head) is left as TRL made it; under ZeRO-3 or FSDP with bf16 it fails with a dtype mismatch "
            "(TRL 1.9 refuses this combination)",
            PATCH_ID,
            ", ".join(sorted(set(skipped))),
        )


def apply(module, patcher) -> None:
    # TRL's hook is a function of the trainer's module: its __module__ names it
    around_init(after=functools.partial(_after, module_name=module.__name__))(module, patcher)
