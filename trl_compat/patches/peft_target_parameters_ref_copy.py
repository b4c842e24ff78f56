"""peft-target-parameters-ref-copy: TRL 1.7 - 1.9 on peft >= 0.20 compute the reference of a
``PeftModel`` whose LoRA uses ``target_parameters`` from the base model, not from a frozen copy of its
adapter: with ``beta != 0`` the KL term pulls a trained adapter towards zero.

The bug
    TRL keeps the reference of a ``PeftModel`` passed in (``beta != 0``, no ``peft_config``) as a
    second adapter, ``"ref"``, a frozen copy of ``"default"`` (PR #4723, 0.27.0); the reference pass is
    ``use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)``. peft 0.17.1 -
    0.19.x refuse a second LoRA adapter with ``target_parameters``, so PR #6043 (``0591272af``, 1.7.0)
    skips the "ref" adapter for every ``LoraConfig`` with ``target_parameters``, with a warning
    ("PEFT can't add a frozen reference adapter alongside one that uses `target_parameters` (peft#3340),
    so the reference log probs are computed from the base model (adapters disabled)..."): the reference
    is the base model. peft 0.20.0 (PR #3350) accepts a second adapter that targets the same parameters,
    yet TRL 1.7.0 - 1.9.x skip it there too: the reference is the base model, the KL term is not zero at
    the first step although the policy still is its start, and it pulls a trained (pretrained or
    custom-initialised) adapter towards the base model instead of its starting point. A freshly
    initialised adapter (``lora_B`` zero) gives the base model's outputs: no difference there.
    ``pip install trl==1.9.2 peft`` resolves peft 0.21 today. Upstream: TRL 1.10.0 (a change between the
    1.9.2 and 1.10.0 wheels) skips the "ref" adapter on ``Version(peft.__version__) < Version("0.20.0")``
    only and makes the copy otherwise.

How the probe recognises it
    ``GRPOTrainer.__init__`` (``_helpers.source.code``) compares ``Version(peft.__version__)`` with
    ``Version("0.20.0")`` in the skip (1.10.0 on): not needed. No skip for
    ``default_config.target_parameters`` (TRL < 1.7, where ``peft-target-parameters-ref-adapter`` takes
    the other side): not needed. The skip with ``model.add_adapter("ref", default_config)`` in its else
    branch: needed where the installed peft's ``LoraModel._create_and_replace`` has no refusal of a
    second ``target_parameters`` adapter (``_helpers.peft_adapters``; peft 0.20 on, its dev builds
    included only once they carry PR #3350), not needed where it has one. Anything else: undecided.

The fix (1.10.0's, from outside the method)
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``, ``during``). Where the call's
    ``model`` is a ``PeftModel`` whose ``"default"`` adapter is a ``LoraConfig`` with
    ``target_parameters``, no ``peft_config`` is passed, ``beta`` (of ``args``, else ``GRPOConfig``'s
    default) is not 0 and the model has no "ref" adapter yet, the "ref" adapter is made before TRL's
    ``__init__`` runs, as 1.10.0 makes it: ``model.add_adapter("ref", model.peft_config["default"])``
    and each ``.default.`` weight copied into its ``.ref.`` twin (peft leaves the new adapter inactive
    and frozen), in the twin's dtype: where ``zero3-peft-mixed-dtype`` (which stacks outside this patch)
    cast the adapter to the model's 16-bit dtype for ZeRO-3, the frozen copy is 16-bit too, so the
    frozen parameters keep one dtype; the values are the same either way. TRL's reference pass then
    finds it. While TRL's ``__init__`` runs, its warning that
    the reference is the base model (no longer true) is held back by a filter on its module's logger,
    removed when the call returns or raises; this patch logs what it did instead.

Run time: load-bearing: errors propagate. Making the copy is the fix itself: falling back to TRL's
code on an error would be the base-model reference, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 1.7.0 - 1.9.x (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import contextlib
import functools
import logging

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.peft_adapters import refuses_a_second_target_parameters_adapter, target_parameters_config
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "peft-target-parameters-ref-copy"
REF = "ref"

_SKIPS = "isinstance(default_config, LoraConfig) and default_config.target_parameters"  # PR #6043 (1.7.0 on)
_MAKES_REF_ELSE = 'model.add_adapter("ref", default_config)'
_PEFT_020 = 'Version(peft.__version__) < Version("0.20.0")'  # 1.10.0
TRL_NOTICE = "PEFT can't add a frozen reference adapter"


def probe(module):
    body = code(module.GRPOTrainer.__init__)
    if _PEFT_020 in body:
        return not_needed("GRPOTrainer skips the 'ref' adapter for target_parameters on peft < 0.20 only (TRL 1.10)")
    if _SKIPS not in body:
        return not_needed("GRPOTrainer does not skip the 'ref' adapter for a LoRA config with target_parameters")
    if _MAKES_REF_ELSE not in body:
        return undecided("GRPOTrainer skips the 'ref' adapter for target_parameters in a way this patch does not know")
    try:
        refuses = refuses_a_second_target_parameters_adapter()
    except ImportError as error:
        return undecided(f"peft's LoRA model cannot be read: {error}")
    if refuses:
        return not_needed("this peft refuses a second LoRA adapter with target_parameters: the base model is the reference")
    return needed(
        "GRPOTrainer skips the 'ref' copy of a PeftModel's adapter for any LoRA config with target_parameters, though "
        "this peft adds one: the reference is the base model, not the adapter's start"
    )


class _HoldTrlNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TRL_NOTICE not in str(record.msg)


def make_ref_copy(model, config) -> None:
    """The "ref" adapter as TRL 1.10.0 makes it: a copy of ``"default"``, inactive and frozen; each weight
    the same values in its twin's dtype (1.10.0 copies into peft's own, fp32 where ``"default"`` was cast)."""
    model.add_adapter(REF, config)
    for name, param in model.named_parameters():
        if ".default." in name:
            model.get_parameter(name.replace(".default.", f".{REF}.")).data = param.data.detach().clone()


def _beta(module, args) -> float:
    if args is None:  # TRL builds GRPOConfig(f"{model_name}-GRPO")
        return getattr(module.GRPOConfig, "beta", 0.0)
    return getattr(args, "beta", 0.0)


@contextlib.contextmanager
def _during(module, trainer, arguments_by_name):
    model = arguments_by_name.get("model")
    config = target_parameters_config(model)
    if (
        config is None
        or arguments_by_name.get("peft_config") is not None
        or _beta(module, arguments_by_name.get("args")) == 0.0
        or REF in model.peft_config
    ):
        yield
        return
    make_ref_copy(model, config)
    log.info(
        "trl_compat: %s: made the 'ref' adapter, a frozen copy of the LoRA adapter with target_parameters, for the "
        "reference log-probs (peft accepts it; TRL 1.10 makes the same copy)",
        PATCH_ID,
    )
    trl_logger = logging.getLogger(module.__name__)
    hold = _HoldTrlNotice()
    trl_logger.addFilter(hold)
    try:
        yield
    finally:
        trl_logger.removeFilter(hold)


def apply(module, patcher) -> None:
    around_init(during=functools.partial(_during, module))(module, patcher)
