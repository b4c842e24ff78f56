"""fsdp2-vllm-sync: under FSDP2, TRL 0.18/0.19 send no weight to vLLM; 0.20 - 0.25 send LoRA's names.

Upstream: 0.18/0.19 fixed in 0.20.0 by PR #3687, commit 5522cc0a3, main-branch builds from PR #3394,
18596cf23, up to it have the bug; the LoRA names of 0.20.0 - 0.25.1 fixed in 0.26.0 by PR #4603,
commit 3979cccad.

Second bug, TRL 0.20.0 - 0.25.1 (research C6; PR #4603): PR #3687's
``GRPOTrainer._sync_fsdp2_params_to_vllm`` sends ``module.state_dict()`` names unmodified. With
LoRA (``is_peft_model``: TRL merges the adapter, then calls it with the ``PeftModel``) these are
``base_model.model....base_layer.weight`` plus ``lora_A``/``lora_B`` entries, and vLLM raises
``ValueError: There is no module or parameter named 'base_model'`` at the first sync (colocate:
in the trainer; server: in the worker). Probe: the method exists on ``GRPOTrainer`` and lacks
``removeprefix("base_model.model.")`` (0.26.0's fix) while walking ``module.state_dict()``,
``full_tensor()`` and ``load_weights``: "needed"; with the fix: "not needed"; another shape:
"undecided". Fix: for a ``PeftModel`` the wrapper runs :func:`sync_fsdp2` below (the merged
``base_layer`` weights under base names, adapters skipped, as PR #4603); any other model runs
TRL's code.

The bug (TRL PR #3670 "params were never synced", fixed by PR #3687): with ``use_vllm=True`` and
FSDP (``self.is_fsdp_enabled``), ``GRPOTrainer._move_model_to_vllm`` hands the model to
``_sync_fsdp_params_to_vllm``, a post-order walk that only acts on modules that are
``isinstance(module, FullyShardedDataParallel)``: FSDP1. Under FSDP2 (accelerate's
``fsdp_version: 2``, torch's ``fully_shard``) no module is an FSDP1 instance, so nothing is sent,
the prefix cache is still reset, and vLLM generates from the initial weights for the whole run
while training goes on: GRPO silently optimises completions of the step-0 policy. No error.

Where it shows: TRL 0.18.0 - 0.19.1 (colocate and server modes), with FSDP2 only. FSDP1, DeepSpeed
and single-process runs take other paths and are left alone.

Probe (0.18/0.19): the source of ``GRPOTrainer._sync_fsdp_params_to_vllm`` tests ``isinstance(module, FSDP)``
and neither it nor ``_move_model_to_vllm`` knows FSDP2 (``full_tensor``, ``fsdp_version``). From
0.20 the FSDP2 sync is TRL's own (the second bug, above, is probed there). Whether a
run uses FSDP2 is only known at the sync, so the patch is applied to the class and acts only when
the module handed to the sync is FSDP2-sharded (a ``torch.distributed.fsdp.FSDPModule`` in it) and
holds no FSDP1 module; any other call runs TRL's own code.

Fix (as PR #3687): walk ``module.state_dict()``, make each sharded ``DTensor`` whole with
``full_tensor()`` (a collective: every rank takes part, in the same order) and load it the way
TRL loads every other parameter: colocate, ``llm_engine.model_executor.driver_worker.model_runner
.model.load_weights([(name, tensor)])`` on each rank; server, ``vllm_client.update_named_param``
on the main process. Unlike PR #3687, names are those of the base model, fixed the way TRL 0.19
fixes PEFT names on its DeepSpeed path (``base_model.model.`` and ``.base_layer`` dropped, LoRA
and ``original_module`` entries skipped, ``modules_to_save.default.`` dropped), plus the
``_checkpoint_wrapped_module.`` / ``_orig_mod.`` wrappers' prefixes. vLLM now generates from the
current weights: generations differ from the unpatched run, which was the bug.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.26 is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import functools
import sys

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import code, defining_class

METHOD = "_sync_fsdp_params_to_vllm"
FSDP2_METHOD = "_sync_fsdp2_params_to_vllm"  # TRL 0.20 - 0.25
_WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")


def probe(module):
    cls = module.GRPOTrainer
    if defining_class(cls, METHOD) is None:
        if defining_class(cls, FSDP2_METHOD) is not None:
            return _probe_fsdp2_sync(cls)
        return not_needed(f"GRPOTrainer has no {METHOD}: not the FSDP1-only weight sync this patch fixes")
    sync, move = code(getattr(cls, METHOD)), code(cls._move_model_to_vllm)
    if "full_tensor" in sync or "fsdp_version" in sync or "fsdp_version" in move:
        return not_needed(f"GRPOTrainer.{METHOD} handles FSDP2 itself")
    if "isinstance(module, FSDP)" not in sync:
        return undecided(f"GRPOTrainer.{METHOD} does not test isinstance(module, FSDP): unknown sync")
    if METHOD not in move:
        return undecided(f"GRPOTrainer._move_model_to_vllm does not call {METHOD}: unknown sync")
    return needed(
        f"GRPOTrainer.{METHOD} only syncs FSDP1 (FullyShardedDataParallel) modules: under FSDP2 it sends "
        "nothing and vLLM generates from the initial weights; the patch sends the full weights of FSDP2 "
        "models (so their generations change, as they should), anything else runs TRL's code"
    )


def _probe_fsdp2_sync(cls):
    """TRL 0.20+: its own FSDP2 sync; 0.20 - 0.25 send PEFT's state_dict names unmodified."""
    sync = code(getattr(cls, FSDP2_METHOD))
    if 'removeprefix("base_model.model.")' in sync:
        return not_needed(f"GRPOTrainer.{FSDP2_METHOD} gives vLLM the base model's names itself (PR #4603)")
    if "module.state_dict()" not in sync or "full_tensor()" not in sync or "load_weights" not in sync:
        return undecided(f"GRPOTrainer.{FSDP2_METHOD} is not the state_dict walk this patch knows")
    return needed(
        f"GRPOTrainer.{FSDP2_METHOD} sends module.state_dict() names as they are: with LoRA under FSDP2, vLLM gets "
        "base_model.model....base_layer and lora_A/B names and raises ValueError at the first sync; the patch "
        "sends the merged weights under the base model's names for PEFT models, anything else runs TRL's code"
    )


def _fsdp2_class():
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None)
    if cls is None:  # torch 2.4/2.5 keep it in the composable API only
        cls = getattr(sys.modules.get("torch.distributed._composable.fsdp"), "FSDPModule", None)
    return cls


def fsdp2_sharded(module) -> bool:
    """Whether ``module`` holds FSDP2-sharded submodules and no FSDP1 one."""
    fsdp2 = _fsdp2_class()
    if fsdp2 is None or not hasattr(module, "modules"):
        return False
    fsdp1 = getattr(sys.modules.get("torch.distributed.fsdp"), "FullyShardedDataParallel", None)
    found = False
    for sub in module.modules():
        if fsdp1 is not None and isinstance(sub, fsdp1):
            return False
        found = found or isinstance(sub, fsdp2)
    return found


def _peft_prefix(module):
    """The adapter-parameter prefix (``lora_``) of a PeftModel, else None."""
    peft = sys.modules.get("peft")
    peft_model = getattr(peft, "PeftModel", None)
    if peft_model is None or not isinstance(module, peft_model):
        return None
    return getattr(module, "prefix", None) or "lora_"


def vllm_name(name: str, peft_prefix):
    """The base-model name vLLM knows for a state_dict key; None for what vLLM must not get."""
    for extra in _WRAPPER_PREFIXES:
        name = name.replace(extra, "")
    if peft_prefix is None:
        return name
    # TRL 0.19's own PEFT name fixing (its DeepSpeed path in _move_model_to_vllm)
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    if peft_prefix in name or "original_module" in name:
        return None
    return name.replace("modules_to_save.default.", "")


def sync_fsdp2(trainer, module) -> None:
    """Send the full weights of an FSDP2 ``module`` to the trainer's vLLM. Call on every rank."""
    import torch

    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    device = getattr(trainer.accelerator, "device", None)
    server = trainer.vllm_mode == "server"
    main = trainer.accelerator.is_main_process
    prefix = _peft_prefix(module)
    llm_model = None
    for key, tensor in module.state_dict().items():
        name = vllm_name(key, prefix)
        if name is None:  # the same keys on every rank: skipping keeps the collectives in step
            continue
        if dtensor is not None and isinstance(tensor, dtensor):
            if tensor.device.type == "cpu" and device is not None and torch.device(device).type != "cpu":
                tensor = tensor.to(device)  # CPU-offloaded shards: the collective runs on the accelerator
            tensor = tensor.full_tensor()  # collective: every rank, same order
        if server:
            if main:
                trainer.vllm_client.update_named_param(name, tensor)
        elif trainer.vllm_mode == "colocate":
            if llm_model is None:
                llm_model = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model
            llm_model.load_weights([(name, tensor)])


def _make_sync(original):
    @functools.wraps(original)
    def _sync_fsdp_params_to_vllm(self, *args, **kwargs):
        passed = arguments(original, self, *args, **kwargs)
        # TRL's recursive calls pass prefix/visited: only the top call can be the whole model
        top = set(passed) == {"self", "module"}
        module = passed.get("module")
        if top and fsdp2_sharded(module):
            sync_fsdp2(self, module)
            return None
        return original(self, *args, **kwargs)

    return _sync_fsdp_params_to_vllm


def _make_fsdp2_sync(original):
    @functools.wraps(original)
    def _sync_fsdp2_params_to_vllm(self, *args, **kwargs):
        passed = arguments(original, self, *args, **kwargs)
        module = passed.get("module")
        if set(passed) == {"self", "module"} and _peft_prefix(module) is not None:
            sync_fsdp2(self, module)  # TRL merged the adapter before calling: base_layer holds W + BA
            return None
        return original(self, *args, **kwargs)

    return _sync_fsdp2_params_to_vllm


def apply(module, patcher):
    if defining_class(module.GRPOTrainer, METHOD) is None:
        patcher.wrap(module.GRPOTrainer, FSDP2_METHOD, _make_fsdp2_sync)
    else:
        patcher.wrap(module.GRPOTrainer, METHOD, _make_sync)
