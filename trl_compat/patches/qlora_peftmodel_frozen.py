"""qlora-peftmodel-frozen: a k-bit PeftModel passed without peft_config gets every parameter frozen.

Remove this patch when trl_compat no longer supports TRL 0.22.0 - 0.23.0 (fixed in 0.23.1 by
PR #4081, commit 5fb8f4c64; on main by 7e2075347, 0.24.0.dev0).

The bug (PR #4081; SFT twin issue #3926): PR #3882 (65d7894b6, 0.22.0.dev0) routed GRPO through
``trl.models.utils.prepare_peft_model`` whenever the model is a ``PeftModel``, also without
``peft_config``. There, a model loaded in 4 or 8 bits (``is_loaded_in_4bit`` /
``is_loaded_in_8bit``) goes through peft's ``prepare_model_for_kbit_training`` even when it is
already a ``PeftModel``; that function sets ``requires_grad = False`` on every parameter, the
LoRA adapters included. Training then fails at the first backward (``element 0 of tensors does
not require grad``) or, with reentrant gradient checkpointing, trains nothing. The usual QLoRA
recipe (load in 4 bits, ``get_peft_model``, pass the PeftModel) hits it.

Affected: TRL 0.22.0 - 0.23.0 and main-branch builds between 65d7894b6 and 7e2075347.

Probe: ``prepare_peft_model`` (read in ``trl.models.utils``) calls
``prepare_model_for_kbit_training(`` without the fixed guard ``not isinstance(model, PeftModel)``,
and ``GRPOTrainer.__init__`` calls ``prepare_peft_model`` for a ``PeftModel``. ``trl.models.utils``
without a ``prepare_model_for_kbit_training`` to wrap gives "undecided".

Fix: ``trl.models.utils``'s binding of ``prepare_model_for_kbit_training`` (the global that
``prepare_peft_model`` calls, wherever ``prepare_peft_model`` is imported from) is wrapped: for a
``PeftModel`` it does what the fixed ``prepare_peft_model`` does instead (enable gradient
checkpointing through TRL's ``enable_gradient_checkpointing`` when asked, nothing else); any other
model gets peft's function unchanged. The adapters keep ``requires_grad`` and train. One binding
covers every caller of ``prepare_peft_model`` (SFT and DPO share the bug and the upstream fix);
``prepare_peft_model``'s other bindings stay TRL's own.
"""

from __future__ import annotations

import functools
import importlib
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "qlora-peftmodel-frozen"
UTILS = "trl.models.utils"
KBIT = "prepare_model_for_kbit_training"

_GUARD = "not isinstance(model, PeftModel)"


def probe(module):
    utils = importlib.import_module(UTILS)
    prepare = getattr(utils, "prepare_peft_model", None)
    if prepare is None:
        return not_needed(f"{UTILS} has no prepare_peft_model")
    source = code(prepare)
    if f"{KBIT}(" not in source:
        return not_needed("prepare_peft_model never calls prepare_model_for_kbit_training")
    if _GUARD in source:
        return not_needed("prepare_peft_model skips k-bit preparation for a PeftModel (fixed code)")
    if "prepare_peft_model(" not in code(module.GRPOTrainer.__init__):
        return not_needed("GRPOTrainer.__init__ does not call prepare_peft_model")
    if not callable(getattr(utils, KBIT, None)):
        return undecided(f"{UTILS} has no {KBIT} binding to wrap (is peft installed?)")
    return needed(
        "prepare_peft_model runs prepare_model_for_kbit_training on a k-bit PeftModel, which freezes every "
        "parameter including the LoRA adapters; a PeftModel now skips it, as TRL 0.23.1 does"
    )


def _wrap_kbit(original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def prepare_model_for_kbit_training(*args, **kwargs):
        from peft import PeftModel

        if signature is None:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # peft reports the bad call as it always did
        bound.apply_defaults()
        model = bound.arguments.get("model")
        if not isinstance(model, PeftModel):
            return original(*args, **kwargs)
        # what TRL 0.23.1's prepare_peft_model does for a PeftModel: `elif args.gradient_checkpointing:`
        if bound.arguments.get("use_gradient_checkpointing"):
            utils = importlib.import_module(UTILS)
            model = utils.enable_gradient_checkpointing(model, bound.arguments.get("gradient_checkpointing_kwargs"))
        return model

    return prepare_model_for_kbit_training


def apply(module, patcher) -> None:
    patcher.wrap(importlib.import_module(UTILS), KBIT, _wrap_kbit)
