"""peft-gradient-checkpointing: LoRA + ``gradient_checkpointing=True`` dies at the first backward.

Main-branch builds: 0.16.0.dev0 builds from before PR #2848, main commit 9b3c5bf64, 2025-02-18 have the bug too.

The bug (issues #2671, #3089; fixed by PR #2848): with a PEFT model and gradient checkpointing in
its default, reentrant form, ``loss.backward()`` raises ``RuntimeError: element 0 of tensors does
not require grad and does not have a grad_fn`` (torch also warns "None of the inputs have
requires_grad=True"). The embeddings are frozen, so the hidden states entering each checkpointed
layer do not require grad, and reentrant checkpointing then returns outputs without a graph:
nothing reaches the LoRA weights. transformers' Trainer turns checkpointing on in ``train()``
without ``enable_input_require_grads()`` for a ``PeftModel``. TRL 0.16.0 calls it in
``GRPOTrainer._enable_gradient_checkpointing`` when ``use_reentrant`` is not False.

Where it shows: TRL 0.14.0 - 0.15.2 and the main-branch builds before 9b3c5bf64, with peft installed,
``gradient_checkpointing=True`` and ``gradient_checkpointing_kwargs`` not setting
``use_reentrant=False``.

Probe: ``GRPOTrainer`` has no ``_enable_gradient_checkpointing`` and its ``__init__`` never calls
``enable_input_require_grads`` (comments dropped).

Fix: after ``GRPOTrainer.__init__``, for a PEFT model with gradient checkpointing on and
``use_reentrant`` not False (TRL 0.16's rule), ``model.enable_input_require_grads()``: a hook that
makes the embedding output require grad, so the checkpointed layers carry a graph to the adapters.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.15.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import logging

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code, defining_class
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "peft-gradient-checkpointing"


def probe(module):
    cls = module.GRPOTrainer
    if defining_class(cls, "_enable_gradient_checkpointing") is not None:
        return not_needed("GRPOTrainer enables gradient checkpointing itself (_enable_gradient_checkpointing)")
    if "enable_input_require_grads" in code(cls.__init__):
        return not_needed("GRPOTrainer.__init__ calls enable_input_require_grads")
    return needed(
        "GRPOTrainer leaves gradient checkpointing to transformers' Trainer, which does not call "
        "enable_input_require_grads for a PeftModel: with reentrant checkpointing the first backward "
        "raises 'element 0 of tensors does not require grad'; it is called after __init__"
    )


def _uses_reentrant(args) -> bool:
    kwargs = getattr(args, "gradient_checkpointing_kwargs", None) or {}
    return "use_reentrant" not in kwargs or bool(kwargs["use_reentrant"])


def _after(trainer, arguments) -> None:
    model, config = getattr(trainer, "model", None), getattr(trainer, "args", None)
    if (
        getattr(config, "gradient_checkpointing", False)
        and _uses_reentrant(config)
        and is_peft_model(model)
        and model is not None
        and callable(getattr(model, "enable_input_require_grads", None))
    ):
        model.enable_input_require_grads()
        log.debug("trl_compat: %s: enable_input_require_grads() on the PEFT model", PATCH_ID)


apply = around_init(after=_after)
