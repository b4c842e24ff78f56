"""dora-magnitude-bf16: with a 4/8-bit model (QLoRA) and DoRA (``use_dora=True``), GRPO casts the DoRA
magnitude vectors to bf16 with the adapter weights, where the optimizer's small updates round away: the
magnitudes silently stay frozen.

The bug
    TRL 0.26.0 (``2af35fb0d``, PR #4577) to 1.14.x cast every trainable parameter of a quantized model
    to bf16 in ``GRPOTrainer.__init__`` (``param.data = param.data.to(torch.bfloat16)``, QLoRA's
    recipe). DoRA's ``lora_magnitude_vector`` is trainable too: its entries are row norms of the
    weights, where bf16's spacing is far above an Adam step at the usual learning rates (1e-6 - 1e-5),
    so each update rounds back to the same value and the magnitude never moves. No error, no warning.
    Upstream: TRL issue #7268, fixed in 1.15.0 (the magnitude vector is left out of the cast).
    TRL 0.14 - 0.25 cast in another place (``peft_module_casting_to_bf16`` with ``bf16=True``), which
    this patch does not reach: its window starts at 0.26.0, and the upstream ledger says so.

How the probe recognises it
    ``GRPOTrainer.__init__`` (comments dropped) names ``lora_magnitude_vector``: not needed (the fixed
    cast). It casts trainable parameters with ``param.data = param.data.to(torch.bfloat16)`` under
    ``is_loaded_in_4bit``: needed. Neither: undecided (a cast this patch does not know).

The fix
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``). Before TRL's ``__init__``, the
    magnitude vectors of the model passed in (a ``PeftModel`` with DoRA) are kept as they are; after
    it, on a 4/8-bit model, each trainable magnitude vector that TRL cast to bf16 gets its kept value
    back (the very tensor: exactly what TRL 1.15 leaves), or, where TRL made the adapter itself
    (``peft_config``), is cast to float32, peft's adapter dtype: its start value then carries the
    bf16 rounding of the cast (at most 2**-9 relative), but it trains. The LoRA A/B weights stay in
    bf16, as in TRL 1.15.

Run time: load-bearing: errors propagate. What the wrapper restores is the fix itself: falling back to
TRL's cast on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.26.0 - 1.14.x are no longer supported (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "dora-magnitude-bf16"
MAGNITUDE = "lora_magnitude_vector"
_CAST = "param.data = param.data.to(torch.bfloat16)"
_QUANTIZED = "is_loaded_in_4bit"
KEPT = "_trl_compat_dora_magnitudes"


def probe(module):
    body = code(module.GRPOTrainer.__init__)
    if MAGNITUDE in body:
        return not_needed("GRPOTrainer leaves the DoRA magnitude vectors out of its bf16 cast")
    if _CAST in body and _QUANTIZED in body:
        return needed(
            "GRPOTrainer casts every trainable parameter of a 4/8-bit model to bf16, DoRA's magnitude vectors "
            "too: their updates round away"
        )
    return undecided("GRPOTrainer.__init__ casts a quantized model's adapters in a way this patch does not know")


def is_quantized(model) -> bool:
    return bool(getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False))


def magnitudes(model) -> list:
    import torch

    if not isinstance(model, torch.nn.Module):
        return []
    return [param for name, param in model.named_parameters() if MAGNITUDE in name and param.requires_grad]


def restore(model, kept: dict) -> int:
    """Undo TRL's bf16 cast of ``model``'s magnitude vectors; returns how many were restored."""
    import torch

    if not is_quantized(model):
        return 0
    restored = 0
    for param in magnitudes(model):
        if param.dtype != torch.bfloat16:
            continue
        original = kept.get(id(param))
        if original is None:  # made inside TRL's __init__ (peft_config): peft's adapter dtype
            param.data = param.data.float()
        elif original.dtype != torch.bfloat16:
            param.data = original
        else:  # bf16 before TRL's cast already (the user's, or zero3-peft-mixed-dtype's): nothing to undo
            continue
        restored += 1
    return restored


def _before(trainer, arguments) -> None:
    model = arguments.get("model")
    # by id: a parameter keeps its identity through TRL's cast, which replaces only its .data
    trainer.__dict__[KEPT] = {id(param): param.data for param in magnitudes(model)}


def _after(trainer, arguments) -> None:
    kept = trainer.__dict__.pop(KEPT, {})
    restore(getattr(trainer, "model", None), kept)


apply = around_init(before=_before, after=_after)
