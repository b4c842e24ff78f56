"""qlora-peftmodel-frozen: a k-bit PeftModel passed to GRPO without peft_config cannot train.

Upstream: fixed in 0.23.1 by PR #4081, commit 5fb8f4c64; on main by 7e2075347, 0.24.0.dev0.

The bug (PR #4081; SFT twin issue #3926): PR #3882 (65d7894b6, 0.22.0.dev0) routed GRPO through
``trl.models.utils.prepare_peft_model`` whenever the model is a ``PeftModel``, also without
``peft_config``. There a model loaded in 4 or 8 bits (``is_loaded_in_4bit`` /
``is_loaded_in_8bit``) takes the k-bit branch even when it already is a ``PeftModel``: peft's
``prepare_model_for_kbit_training`` sets ``requires_grad = False`` on every parameter, the LoRA
adapters included, so the first backward fails (``element 0 of tensors does not require grad``)
or, with reentrant gradient checkpointing, nothing trains (TRL 0.23.0). On TRL 0.22.x the same
branch first dies in ``__init__``: it rebuilds the config with ``dataclasses.replace(args, ...)``,
which ``GRPOConfig.__post_init__`` rejects (``ValueError: 'generation_batch_size' and
'steps_per_generation' can not be both configured at the same time``; PR #3981, 0.23.0, made it
``args.gradient_checkpointing = False``). The usual QLoRA recipe (load in 4 bits,
``get_peft_model``, pass the PeftModel) hits it.

Where it shows: TRL 0.22.0 - 0.23.0 and main-branch builds between 65d7894b6 and 7e2075347.

Probe: ``prepare_peft_model`` (read in ``trl.models.utils``) calls
``prepare_model_for_kbit_training(`` without the fixed guard ``not isinstance(model, PeftModel)``,
and ``GRPOTrainer.__init__`` calls ``prepare_peft_model``. A ``trl.models.utils`` without the
helpers the fix calls (``enable_gradient_checkpointing``, ``peft_module_casting_to_bf16``) gives
"undecided".

Fix: ``prepare_peft_model`` is wrapped where GRPO reads it (``trl.trainer.grpo_trainer``'s
binding) and where it is defined (``trl.models.utils``). For a ``PeftModel`` in 4/8 bits, given
without ``peft_config`` and not sharded (no ``Params4bit`` on the CPU/meta device, TRL's own
test), it does what TRL 0.23.1's function does there: enable gradient checkpointing through TRL's
``enable_gradient_checkpointing`` when ``args.gradient_checkpointing``, cast for bf16 through TRL's
``peft_module_casting_to_bf16`` when ``args.bf16`` and 4-bit, nothing else; the adapters keep
``requires_grad``. Any other call runs TRL's function. A k-bit model given *with* ``peft_config`` meets the
``dataclasses.replace`` ValueError on TRL 0.22.x too: qlora-config-rebuild fixes that.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.22.x and 0.23.0 are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import importlib
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "qlora-peftmodel-frozen"
UTILS = "trl.models.utils"
NAME = "prepare_peft_model"
KBIT = "prepare_model_for_kbit_training"
HELPERS = ("enable_gradient_checkpointing", "peft_module_casting_to_bf16")

_GUARD = "not isinstance(model, PeftModel)"


def probe(module):
    utils = importlib.import_module(UTILS)
    prepare = getattr(utils, NAME, None)
    if prepare is None:
        return not_needed(f"{UTILS} has no {NAME}")
    source = code(prepare)
    if f"{KBIT}(" not in source:
        return not_needed(f"{NAME} never calls {KBIT}")
    if _GUARD in source:
        return not_needed(f"{NAME} skips k-bit preparation for a PeftModel (fixed code)")
    if f"{NAME}(" not in code(module.GRPOTrainer.__init__):
        return not_needed(f"GRPOTrainer.__init__ does not call {NAME}")
    missing = [name for name in HELPERS if not callable(getattr(utils, name, None))]
    if missing:
        return undecided(f"{UTILS} lacks {', '.join(missing)}, which the fix calls")
    return needed(
        f"{NAME} runs {KBIT} on a k-bit PeftModel, which freezes every parameter including the LoRA adapters "
        "(and on TRL 0.22 rebuilds GRPOConfig, which raises ValueError); a PeftModel now skips it, as TRL 0.23.1 does"
    )


def _is_kbit(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def _is_sharded_qlora(model) -> bool:
    # TRL's own test in prepare_peft_model: FSDP/ZeRO-3 keep 4-bit weights on the CPU or meta device
    if not getattr(model, "is_loaded_in_4bit", False):
        return False
    for _, param in model.named_parameters():
        if param.__class__.__name__ == "Params4bit":
            return param.data.device.type in {"cpu", "meta"}
    return False


def _existing_adapter(model, args):
    """What TRL 0.23.1's prepare_peft_model does for a k-bit PeftModel without peft_config."""
    utils = importlib.import_module(UTILS)
    if getattr(args, "gradient_checkpointing", False):
        model = utils.enable_gradient_checkpointing(model, getattr(args, "gradient_checkpointing_kwargs", None))
    if getattr(args, "bf16", False) and getattr(model, "is_loaded_in_4bit", False):
        utils.peft_module_casting_to_bf16(model)
    return model


def _wrap_prepare(original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def prepare_peft_model(*args, **kwargs):
        if signature is not None:
            try:
                arguments = signature.bind(*args, **kwargs).arguments
            except TypeError:
                arguments = {}  # TRL reports the bad call as it always did
            model = arguments.get("model")
            if arguments and arguments.get("peft_config") is None and _is_kbit(model) and not _is_sharded_qlora(model):
                from peft import PeftModel

                if isinstance(model, PeftModel):
                    return _existing_adapter(model, arguments.get("args"))
        return original(*args, **kwargs)

    return prepare_peft_model


def apply(module, patcher) -> None:
    utils = importlib.import_module(UTILS)
    original = getattr(module, NAME)
    wrapper = patcher.wrap(module, NAME, _wrap_prepare)
    if getattr(utils, NAME, None) is original:
        patcher.replace(utils, NAME, wrapper, above=original)
