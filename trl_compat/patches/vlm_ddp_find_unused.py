"""vlm-ddp-find-unused: GRPO of a vision-language model on several processes (DDP) with gradient
checkpointing dies at the second training forward after a text-only batch: ``RuntimeError: Expected to
have finished reduction in the prior iteration before starting a new one. This error indicates that your
module has parameters that were not used in producing loss. You can enable unused parameter detection by
passing the keyword argument `find_unused_parameters=True` to `torch.nn.parallel.DistributedDataParallel```.

The bug
    A text-only sample (a text-only dataset, or a text-only batch of a mixed one) never runs the vision
    tower, so its parameters get no gradient. DDP then waits for them unless it looks for unused
    parameters, and transformers' ``Trainer`` only asks it to without gradient checkpointing
    (``find_unused_parameters = not model.is_gradient_checkpointing``, transformers#49443), which
    ``GRPOConfig`` turns on by default from 0.22 (0.20 - 0.21: when the user asks). Non-reentrant
    checkpointing, which DDP with ``find_unused_parameters=True`` supports, is GRPO's default on
    transformers < 5 from TRL 0.27 and transformers 5's own default; TRL handles a ``ProcessorMixin``
    (a VLM) in ``GRPOTrainer`` from 0.20.0. Reentrant checkpointing (transformers 4's default, and on
    transformers 4 what TRL 0.22 - 1.15 bring back after each generation, see below) cannot be combined
    with unused-parameter detection ("Expected to mark a variable ready only once"): a text-only batch
    fails there either way, and neither TRL nor this patch changes it.
    Upstream: TRL 1.16.0 (``GRPOTrainer.__init__``) sets ``args.ddp_find_unused_parameters = True`` for a
    VLM when the user left it unset and ``use_reentrant`` is not asked for.

How the probe recognises it
    ``GRPOTrainer.__init__`` (comments dropped) sets ``args.ddp_find_unused_parameters = True``: not
    needed. It tells a ``ProcessorMixin`` processing class (a VLM) from a tokenizer without it: needed.
    No ``ProcessorMixin`` in ``__init__`` at all (TRL < 0.20, main before VLM support): not needed.
    Anything else (the processor handled in a way not known here): undecided.

The fix
    After TRL's ``__init__`` (``_helpers.trainer_init``), for a VLM trainer (TRL's ``_is_vlm``; before 1.x,
    ``processing_class`` is a ``ProcessorMixin``) whose ``args.ddp_find_unused_parameters`` is None and
    whose training forwards do not checkpoint reentrantly: ``args.ddp_find_unused_parameters = True``, as
    TRL 1.16 does before its ``super().__init__``. transformers 4 reads it when it wraps the model
    (``_wrap_model``, in ``train()``); newer transformers read it in ``Trainer.__init__`` into the
    accelerator's ``DistributedDataParallelKwargs`` (``ddp_handler``), whose ``find_unused_parameters`` is
    then set too. Reentrant means: ``use_reentrant`` asked for (or a ``gradient_checkpointing_kwargs``
    without it: torch's default), or left to transformers where its default is reentrant (4.x); and on TRL
    0.22 - 1.15, whose ``unwrap_model_for_generation`` re-enables checkpointing after each generation with
    transformers' defaults (``gradient_checkpointing_enable()``, before the first training forward; 1.16
    passes the kwargs), transformers 4 checkpoints reentrantly whatever was asked ("Expected to mark a
    variable ready only once" with the flag on, found in a 2-process run of TRL 0.22.1 on 4.55.4): left
    alone there. A text model and a value the user set are left as they are.

Run time: the patch's own reading of the trainer runs inside ``guarded(...)``: on an error DDP keeps
transformers' choice (TRL's behaviour).

Delete when: trl_compat no longer supports TRL 0.20.0 - 1.15.x (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import logging
import sys
from typing import Any

from trl_compat._engine import guarded, needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "vlm-ddp-find-unused"

FIXED = "args.ddp_find_unused_parameters = True"
# 0.20 on: isinstance(processing_class, ProcessorMixin) picks the processor's tokenizer
TELLS_VLM = "isinstance(processing_class, ProcessorMixin)"
# transformers' PreTrainedModel.gradient_checkpointing_enable: its kwargs where none are given (5.x; named
# gradient_checkpointing_kwargs, activation_checkpointing_kwargs from 5.2x)
_NON_REENTRANT_DEFAULT = '_checkpointing_kwargs = {"use_reentrant": False}'


def probe(module):
    init = code(module.GRPOTrainer.__init__)
    if FIXED in init:
        return not_needed("GRPOTrainer.__init__ sets ddp_find_unused_parameters for a VLM (fixed code)")
    if "ProcessorMixin" not in init:
        return not_needed("GRPOTrainer.__init__ takes no VLM processor (TRL < 0.20)")
    if TELLS_VLM in init:
        return needed(
            "GRPOTrainer.__init__ takes a VLM processor but leaves ddp_find_unused_parameters to transformers, which "
            "turns it off under gradient checkpointing: a text-only batch leaves the vision tower without gradients "
            "and DDP fails"
        )
    return undecided("GRPOTrainer.__init__ handles the processing class in a way this patch does not know")


def _is_vlm(trainer) -> bool:
    flag = getattr(trainer, "_is_vlm", None)
    if isinstance(flag, bool):
        return flag
    from transformers import ProcessorMixin

    return isinstance(getattr(trainer, "processing_class", None), ProcessorMixin)


def transformers_default_reentrant() -> bool:
    """Whether transformers' ``gradient_checkpointing_enable()`` without kwargs checkpoints reentrantly
    (transformers 4: yes; 5: no). Unreadable: yes (the patch then leaves the run alone)."""
    from transformers import PreTrainedModel

    names = ("gradient_checkpointing_enable", "activation_checkpointing_enable", "_activation_checkpointing_enable")
    try:  # 5.2x: gradient_checkpointing_enable hands over to _activation_checkpointing_enable
        sources = [code(getattr(PreTrainedModel, name)) for name in names if hasattr(PreTrainedModel, name)]
    except Exception:  # noqa: BLE001 - any failure to read means: unknown
        return True
    return not any(_NON_REENTRANT_DEFAULT in source for source in sources)


def reenables_with_defaults(module) -> bool:
    """Whether TRL's ``unwrap_model_for_generation`` (as the GRPO module imports it) re-enables gradient
    checkpointing after generating with transformers' defaults, dropping the user's kwargs (TRL 0.22 - 1.15)."""
    function = getattr(module, "unwrap_model_for_generation", None)
    if function is None:
        return False
    # 1.x: the checkpointing toggle sits in the private helper it calls
    helper = getattr(sys.modules.get(getattr(function, "__module__", "") or ""), "_unwrap_model_for_generation", None)
    try:
        return any("gradient_checkpointing_enable()" in code(f) for f in (function, helper) if f is not None)
    except Exception:  # noqa: BLE001 - unreadable: assume it does (the patch then acts on transformers 5 only)
        return True


def reentrant_checkpointing(args: Any, reenabled_with_defaults: bool = False) -> bool:
    """Whether the training forwards checkpoint reentrantly: ``args`` as transformers' ``Trainer`` enables
    them, and, where TRL re-enables checkpointing with transformers' defaults after each generation
    (``reenabled_with_defaults``), transformers' default too."""
    if not getattr(args, "gradient_checkpointing", False):
        return False
    kwargs = getattr(args, "gradient_checkpointing_kwargs", None)
    if kwargs is None or reenabled_with_defaults:
        if transformers_default_reentrant():
            return True
    if kwargs is None:
        return False
    if "use_reentrant" not in kwargs or kwargs["use_reentrant"] is None:
        return True  # torch.utils.checkpoint's default
    return bool(kwargs["use_reentrant"])


def _after(reenabled_with_defaults: bool, trainer, arguments) -> None:
    with guarded(PATCH_ID, "asking DDP to find unused parameters of a VLM", fallback="DDP keeps transformers' choice", logger=log):
        args = getattr(trainer, "args", None)
        if args is None or getattr(args, "ddp_find_unused_parameters", False) is not None:
            return  # the user's value stands
        if not _is_vlm(trainer) or reentrant_checkpointing(args, reenabled_with_defaults):
            return
        args.ddp_find_unused_parameters = True
        handler = getattr(getattr(trainer, "accelerator", None), "ddp_handler", None)
        if handler is not None and hasattr(handler, "find_unused_parameters"):
            handler.find_unused_parameters = True  # read from args in Trainer.__init__ (newer transformers)


def apply(module, patcher) -> None:
    around_init(after=functools.partial(_after, reenables_with_defaults(module)))(module, patcher)
