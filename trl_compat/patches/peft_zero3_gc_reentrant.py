"""peft-zero3-gc-reentrant: PEFT + DeepSpeed ZeRO-3 + gradient checkpointing (GRPO's default) dies in
the first backward: ``torch.utils.checkpoint.CheckpointError: torch.utils.checkpoint: Recomputed values
for the following tensors have different metadata than during the forward pass``.

The bug (TRL issues #5217, #2514; fixed by PR #6356, main commit 84e83143a, in 1.9.0)
    Non-reentrant checkpointing saves each tensor's metadata in the forward and checks it when the
    layer is recomputed in the backward. Under ZeRO-3 a frozen parameter (a norm's weight, a frozen
    base ``Linear`` beside its LoRA adapter) is gathered for the forward (``shape [64]``) and released
    again before the recomputation, which then sees it at ZeRO-3's placeholder shape ``[0]``: the
    check fails (transformers#47254; DeepSpeed#8130, not released, would re-gather it). Reentrant
    checkpointing recomputes under its own forward, through ZeRO-3's hooks, and has no such check.
    TRL PR #4811 (40d8759d1, 0.27.0) made ``use_reentrant=False`` GRPO's default on transformers < 5
    (``GRPOConfig.__post_init__`` in 0.27.x, ``GRPOTrainer.__init__`` from 0.28); transformers 5 made
    it its own default (transformers#43203); ``gradient_checkpointing`` defaults to True in
    ``GRPOConfig``. So every GRPO run with LoRA under ZeRO-3 and default settings crashes, from TRL
    0.27.0 to 1.8.x. TRL 1.9.0 (#6356) forces ``use_reentrant=True`` for PEFT + ZeRO-3 + gradient
    checkpointing in ``GRPOTrainer.__init__`` and warns when the user had set False.

How the probe recognises it
    Needed when ``GRPOTrainer.__init__`` (comments dropped) has no ``["use_reentrant"] = True``
    assignment, #6356's guard, while it does handle gradient checkpointing; not needed where it has
    it; undecided where ``__init__`` never mentions ``gradient_checkpointing`` (the code moved).

The fix
    Before TRL's ``__init__`` runs (``_helpers.trainer_init``), for a PEFT run (``peft_config`` given or
    the model already a ``PeftModel``), ZeRO-3 (``args.deepspeed_plugin.zero_stage == 3``, what
    ``TrainingArguments`` sets from a stage-3 DeepSpeed config or accelerate's environment) and
    ``args.gradient_checkpointing``: ``args.gradient_checkpointing_kwargs["use_reentrant"] = True``,
    as TRL 1.9 does, with a warning where it was False (set by the user, or on TRL 0.27.x by
    ``GRPOConfig`` itself). TRL's own ``setdefault("use_reentrant", False)`` later in ``__init__`` then
    leaves it. TRL already calls ``enable_input_require_grads()`` for a PEFT model with gradient
    checkpointing, which reentrant checkpointing needs. Anything else is left untouched.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 1.8.x (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import logging
import re

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "peft-zero3-gc-reentrant"
# TRL 1.9's guard: args.gradient_checkpointing_kwargs["use_reentrant"] = True
FORCED = re.compile(r"""\[\s*["']use_reentrant["']\s*\]\s*=\s*True""")


def probe(module):
    init = code(module.GRPOTrainer.__init__)
    if FORCED.search(init):
        return not_needed("GRPOTrainer.__init__ forces use_reentrant=True for PEFT + ZeRO-3 + gradient checkpointing")
    if "gradient_checkpointing" not in init:
        return undecided("GRPOTrainer.__init__ does not mention gradient_checkpointing: where TRL sets it is unknown")
    return needed(
        "GRPOTrainer.__init__ keeps non-reentrant gradient checkpointing under PEFT + ZeRO-3: the first backward's "
        "recomputation sees the released ZeRO-3 parameters (CheckpointError); use_reentrant=True is set before it"
    )


def _zero3(args) -> bool:
    plugin = getattr(args, "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", None) == 3


def _before(trainer, arguments) -> None:
    args = arguments.get("args")
    peft = arguments.get("peft_config") is not None or is_peft_model(arguments.get("model"))
    if not (peft and getattr(args, "gradient_checkpointing", False) and _zero3(args)):
        return
    kwargs = args.gradient_checkpointing_kwargs or {}
    if kwargs.get("use_reentrant") is False:
        log.warning(
            "trl_compat: %s: PEFT with DeepSpeed ZeRO-3 and gradient checkpointing needs use_reentrant=True "
            "(non-reentrant recomputation sees the released ZeRO-3 parameters and raises CheckpointError): "
            "gradient_checkpointing_kwargs['use_reentrant'] False is set to True, as TRL 1.9 does",
            PATCH_ID,
        )
    kwargs["use_reentrant"] = True
    args.gradient_checkpointing_kwargs = kwargs


apply = around_init(before=_before)
