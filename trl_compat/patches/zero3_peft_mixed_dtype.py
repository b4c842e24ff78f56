"""zero3-peft-mixed-dtype: DeepSpeed 0.19.2 ZeRO-3 + LoRA on a bf16 model dies at the first optimizer
step: ``TypeError: output tensor must have the same type as input tensor``.

Upstream: DeepSpeed 0.19.3 carries the fixes; TRL 1.7 fixed its ``peft_config`` path only.

The bug (TRL issue #6089, DeepSpeed issue #8072)
    DeepSpeed 0.19.2 (PR #8066, b919284ab) stopped casting the whole ZeRO-Init module to bf16 in
    ``_configure_distributed_model``. PEFT's ``get_peft_model`` (peft >= 0.12) upcasts the adapter
    weights to fp32 by default (``autocast_adapter_dtype=True``), so a bf16 base model carries fp32
    LoRA weights; ``_allgather_params_coalesced`` allocates every output buffer with the first
    parameter's dtype, and the re-gather of the persistent parameters after the first optimizer step
    raises the TypeError. Every TRL that calls ``get_peft_model`` without ``autocast_adapter_dtype``:
    0.14 - 1.6 (TRL PR #6091, bf6a7b512, in 1.7.0, passes ``autocast_adapter_dtype=False`` under
    ZeRO-3 for unquantised models). DeepSpeed fixed the gather itself in PRs #8073 (b5b3fded4) and
    #8113 (195255e7e), both first released in 0.19.3: the window is DeepSpeed 0.19.2 (and its
    0.19.3.dev builds), peft >= 0.12. (tests/support/zero3_lora_worker.py's run, unpatched, fails on
    0.19.2 and trains with fp32 adapters on 0.19.3.) On gloo the error reads ``RuntimeError:
    ProcessGroupGloo::allgather: invalid tensor type``; in a GRPO run it comes at the first gather of
    the whole model, TRL's ``unwrap_model_for_generation``, before any optimizer step.
    TRL 1.7's fix is in the ``peft_config`` branch only: a model that arrives already a ``PeftModel``
    (the user's own ``get_peft_model``, under ZeRO-Init through ``TrainingArguments``' DeepSpeed
    config) keeps peft's fp32 adapters beside the bf16 model, and crashes the same way with every TRL
    release (tests/support/zero3_lora_worker.py ``--peft-model``, on TRL 1.0).

How the probe recognises it
    Where GRPOTrainer creates the PEFT model: ``GRPOTrainer.__init__`` calls ``get_peft_model(``
    itself (TRL 0.14 - 0.21, 0.26+) or ``prepare_peft_model(`` (TRL 0.22 - 0.25), which calls
    ``trl.models.utils.get_peft_model`` (passing ``autocast_adapter_dtype`` only for sharded QLoRA).
    Where that call site never sets ``autocast_adapter_dtype`` under ZeRO-3 (an ``__init__``
    that mentions ``autocast_adapter_dtype``, TRL 1.7+, does; a ``prepare_peft_model`` that reads the
    ZeRO stage would), both paths are fixed; where it does, only the ``PeftModel`` path (needed:
    no TRL release casts a ``PeftModel`` it is given). Neither call found: undecided. Not needed
    where peft's ``get_peft_model`` has no ``autocast_adapter_dtype`` (it did not upcast then).

The fix
    The ``get_peft_model`` name that call site looks up (``trl.trainer.grpo_trainer.get_peft_model``
    or ``trl.models.utils.get_peft_model``) is wrapped: when transformers says ZeRO-3 is on
    (``is_deepspeed_zero3_enabled()``: ZeRO-Init, set by ``TrainingArguments`` with a stage-3
    DeepSpeed config or by accelerate's stage-3 plugin with ``zero3_init``; a model loaded without
    ZeRO-Init is still cast whole by DeepSpeed 0.19.2, so it has no mixed dtypes), the model is not
    quantised (no ``is_loaded_in_4bit``/``is_loaded_in_8bit``) and the caller did not pass
    ``autocast_adapter_dtype``, it passes ``autocast_adapter_dtype=False``: the adapters keep the base
    model's dtype, as TRL 1.7 does. Anything else is passed through untouched.
    ``trl.models.utils.get_peft_model`` is shared by TRL's other trainers (``prepare_peft_model``): they
    get the same fix under ZeRO-3, which is where they have the same bug. That wrapper is only
    installed where the call site does not pass the argument itself (TRL < 1.7).
    A model that arrives as a ``PeftModel``: before ``GRPOTrainer.__init__`` (``_helpers.trainer_init``),
    under ZeRO-3 (the same test) and unquantised, every trainable parameter that ZeRO-3 has not taken
    over yet (no ``ds_id``) and is fp32 while the frozen ones all have one 16-bit dtype is cast to it,
    as ``autocast_adapter_dtype=False`` would have left it (a warning says so). Parameters ZeRO-3 has
    already partitioned are left alone (a warning names them): casting a shard is DeepSpeed's business.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports DeepSpeed 0.19.2 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import logging

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "zero3-peft-mixed-dtype"

KWARG = "autocast_adapter_dtype"


def call_site(module):
    """``(owner, where)``: the module whose ``get_peft_model`` GRPOTrainer ends up calling, and
    where the call is; ``(None, None)`` when neither call is found."""
    init = code(module.GRPOTrainer.__init__)
    if "get_peft_model(" in init and hasattr(module, "get_peft_model"):
        return module, "GRPOTrainer.__init__"
    if "prepare_peft_model(" in init:
        import trl.models.utils as utils

        if hasattr(utils, "get_peft_model") and "get_peft_model(" in code(utils.prepare_peft_model):
            return utils, "trl.models.utils.prepare_peft_model"
    return None, None


def call_site_sets_kwarg(module, owner, where) -> bool:
    """Whether the call site of :func:`call_site` passes ``autocast_adapter_dtype`` under ZeRO-3 itself."""
    if where == "GRPOTrainer.__init__":
        return KWARG in code(module.GRPOTrainer.__init__)
    return any(s in code(owner.prepare_peft_model) for s in ("zero_stage", "zero3"))


def probe(module):
    owner, where = call_site(module)
    if owner is None:
        return undecided("GRPOTrainer.__init__ calls neither get_peft_model nor prepare_peft_model")
    import peft

    if KWARG not in inspect.signature(peft.get_peft_model).parameters:
        return not_needed("peft's get_peft_model has no autocast_adapter_dtype (adapters keep the model's dtype)")
    if call_site_sets_kwarg(module, owner, where):
        return needed(
            f"{where} sets autocast_adapter_dtype for the peft_config it wraps, but a model passed as a PeftModel keeps "
            "fp32 adapters beside a bf16 model: under ZeRO-3 on DeepSpeed 0.19.2 the first all-gather fails"
        )
    return needed(
        f"{where} calls get_peft_model without autocast_adapter_dtype (nor casts a PeftModel it is given): under "
        "ZeRO-3 on DeepSpeed 0.19.2 the fp32 LoRA weights beside a bf16 model fail the first all-gather"
    )


def _zero3_enabled() -> bool:
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    return bool(is_deepspeed_zero3_enabled())


def _quantised(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def _zero3_args(args) -> bool:
    plugin = getattr(args, "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", None) == 3


def cast_adapters(model) -> list:
    """The fp32 trainable parameters of ``model`` cast to its frozen parameters' one 16-bit dtype;
    the names cast (none where the frozen ones do not share one 16-bit dtype)."""
    import torch

    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    if len(frozen) != 1 or next(iter(frozen)) not in (torch.bfloat16, torch.float16):
        return []
    (dtype,) = frozen
    cast, sharded = [], []
    for name, param in model.named_parameters():
        if not (param.requires_grad and param.dtype == torch.float32):
            continue
        if hasattr(param, "ds_id"):
            sharded.append(name)
            continue
        param.data = param.data.to(dtype)
        cast.append(name)
    if sharded:
        log.warning(
            "trl_compat: %s: %d fp32 trainable parameters of the PeftModel are already partitioned by ZeRO-3 (%s ...) "
            "beside a %s model: DeepSpeed 0.19.2's all-gather will fail; build the adapters with "
            "get_peft_model(..., autocast_adapter_dtype=False)",
            PATCH_ID,
            len(sharded),
            sharded[0],
            dtype,
        )
    return cast


def _before_init(trainer, arguments) -> None:
    model = arguments.get("model")
    if not is_peft_model(model) or _quantised(model):
        return
    if not (_zero3_enabled() or _zero3_args(arguments.get("args"))):
        return
    cast = cast_adapters(model)
    if cast:
        log.warning(
            "trl_compat: %s: %d fp32 adapter parameters of the PeftModel cast to the model's 16-bit dtype "
            "(DeepSpeed 0.19.2's ZeRO-3 all-gather fails on mixed dtypes), as get_peft_model(..., "
            "autocast_adapter_dtype=False) would have built them",
            PATCH_ID,
            len(cast),
        )


def apply(module, patcher):
    around_init(before=_before_init)(module, patcher)
    owner, where = call_site(module)
    if call_site_sets_kwarg(module, owner, where):
        return

    def factory(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def get_peft_model(*args, **kwargs):
            try:
                arguments = signature.bind_partial(*args, **kwargs).arguments
            except TypeError:  # peft's own call reports it
                return original(*args, **kwargs)
            if KWARG not in arguments and _zero3_enabled() and not _quantised(arguments.get("model")):
                kwargs[KWARG] = False
            return original(*args, **kwargs)

        return get_peft_model

    patcher.wrap(owner, "get_peft_model", factory)
