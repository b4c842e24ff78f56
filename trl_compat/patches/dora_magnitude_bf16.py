"""dora-magnitude-bf16: with a 4/8-bit model (QLoRA) and DoRA (``use_dora=True``), GRPO casts the DoRA
magnitude vectors to bf16 with the adapter weights, where the optimizer's small updates round away: the
magnitudes silently stay frozen.

The bug
    PR #4577 ("Clean up model preparation", main-branch commit ``2af35fb0d``, first released in 0.26.0)
    replaced ``prepare_peft_model`` in ``GRPOTrainer.__init__`` by TRL's own steps, among them QLoRA's
    recipe: on a model with ``is_loaded_in_4bit``/``is_loaded_in_8bit``, every trainable parameter is
    cast to bf16 (``param.data = param.data.to(torch.bfloat16)``). DoRA's ``lora_magnitude_vector`` is
    trainable too: its entries are row norms of the weights, where bf16's spacing (2**-8 to 2**-7 of
    the value) is far above an Adam step at GRPO's usual learning rates (1e-6 - 1e-5), so each update
    rounds back to the same value and the magnitude never moves. No error, no warning.
    Before PR #4577 nothing cast a trainable parameter to bf16: ``prepare_peft_model``'s
    ``peft_module_casting_to_bf16`` (0.22 - 0.25, with ``bf16=True``) casts only norm layers (to fp32)
    and the embeddings and LM head (to bf16), and peft makes the magnitudes fp32.
    Upstream: TRL issue #7268, fixed in 1.15.0. The fix is read from the 1.14.2 and 1.15.0 wheels (the
    ledger's record ``1.14.2..1.15.0:trl/trainer/grpo_trainer.py#2``; its PR and main-branch commit are
    not in the history the ledger reads): the cast loop iterates ``named_parameters()`` and skips names
    containing ``lora_magnitude_vector``.

How the probe recognises it
    ``GRPOTrainer.__init__`` (comments dropped) names ``lora_magnitude_vector``: not needed (the fixed
    cast, 1.15.0 on). It casts nothing to bf16 at all: not needed (the releases and main-branch builds
    before PR #4577). It casts trainable parameters with ``param.data = param.data.to(torch.bfloat16)``
    and reads ``is_loaded_in_4bit``: needed. Otherwise (a bf16 cast in a form this patch does not
    know): undecided.

The fix
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``). Before TRL's ``__init__``, the
    magnitude vectors of the model passed in (a ``PeftModel`` with DoRA) are kept as they are; after
    it, on a 4/8-bit model, each trainable magnitude vector that TRL cast to bf16 gets its kept value
    back (the very tensor, on the parameter's device: exactly what TRL 1.15 leaves), or, where TRL made
    the adapter itself (``peft_config``), is cast to float32, peft's adapter dtype: its start value
    then carries the bf16 rounding of the cast (at most 2**-8 relative), but it trains. A magnitude
    that was bf16 before TRL's ``__init__`` stays so. The LoRA A/B weights stay in bf16, as in TRL 1.15.

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
    if "bfloat16" not in body:
        return not_needed("GRPOTrainer.__init__ casts no parameter to bf16")
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
            param.data = original.to(device=param.device)
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
