"""peft-target-parameters-ref-adapter: ``GRPOTrainer`` given a ``PeftModel`` whose LoRA uses
``target_parameters`` (LoRA on ``nn.Parameter``s, e.g. the fused MoE experts of transformers 5), with
``beta != 0``, dies in ``__init__`` on peft 0.17.1 - 0.19.x.

The bug
    PR #4723 (main-branch commit ``42cce51cf``, first in 0.27.0) keeps the reference of a ``PeftModel``
    passed in as a second adapter: ``model.add_adapter("ref", model.peft_config["default"])``, then a
    copy of every ``.default.`` weight into its ``.ref.`` twin; the reference log-probs are computed with
    ``use_adapter(model, adapter_name="ref" if "ref" in model.peft_config else None)``. peft 0.17.1 -
    0.19.x refuse a second LoRA adapter with ``target_parameters`` (peft PR #2710, issue #3340), so the
    trainer cannot be built: ``ValueError: Adding a LoRA config with `target_parameters=[...]` but there
    are already other LoRA adapters on this model that use `target_parameters`. At the moment, only one
    LoRA adapter per model with `target_parameters` is allowed.`` (TRL issue #5222). A ``peft_config``
    passed to the trainer instead never meets it (no "ref" adapter: the reference is the base model).
    Upstream: TRL PR #6043 (``0591272af``, first in 1.7.0) skips the "ref" adapter for a ``LoraConfig``
    with ``target_parameters`` (with a warning), so that the reference is the base model, adapters
    disabled; 1.10.0 skips it on peft < 0.20 only (``peft-target-parameters-ref-copy``).

How the probe recognises it
    ``GRPOTrainer.__init__`` (``_helpers.source.code``) tests ``default_config.target_parameters``
    (PR #6043's skip): not needed. No ``add_adapter("ref"`` (TRL < 0.27): not needed. It calls
    ``model.add_adapter("ref", model.peft_config["default"])`` and copies with
    ``model.get_parameter(ref_name)``: needed where the installed peft's ``LoraModel._create_and_replace``
    has the refusal (``_helpers.peft_adapters``), not needed where it has none (peft 0.17.0, 0.20 on:
    TRL's copy is made). Any other form of the "ref" adapter: undecided.

The fix (PR #6043's, from outside the method)
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``, ``during``). Where the call's
    ``model`` is a ``PeftModel`` whose ``"default"`` adapter is a ``LoraConfig`` with
    ``target_parameters`` and no ``peft_config`` is passed, the model gets two instance attributes for
    the length of TRL's ``__init__`` (``instance_overrides``; gone when it returns or raises):
    ``add_adapter`` skips an adapter named ``"ref"`` that peft would refuse (logging why, as TRL 1.7 does)
    and passes every other call to peft; ``get_parameter`` answers a ``.ref.`` name that the skipped
    adapter would have had with its ``.default.`` twin, so TRL's copy loop copies each weight onto
    itself (no change, nothing allocated), and raises peft's own ``AttributeError`` for any other name
    it lacks. With no "ref" adapter, TRL's reference pass disables the adapter: the reference log-probs
    are the base model's, those of TRL 1.7 - 1.9 (and of 1.10 on peft < 0.20). They equal the adapter's
    own only while it is freshly initialised (``lora_B`` zero); a trained adapter needs peft >= 0.20 for
    a reference copy of it. ``beta == 0`` never reaches the "ref" adapter: nothing happens.

Run time: load-bearing: errors propagate. What the overrides do is the fix itself: falling back to
TRL's own call on an error would be the crash (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.27.0 - 1.6.x on peft 0.17.1 - 0.19.x (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import contextlib
import logging

from trl_compat._engine import instance_overrides, needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.peft_adapters import refuses_a_second_target_parameters_adapter, target_parameters_config
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "peft-target-parameters-ref-adapter"
REF = "ref"

_SKIPS = "default_config.target_parameters"  # PR #6043 (1.7.0 on)
_MAKES_REF = 'model.add_adapter("ref", model.peft_config["default"])'  # PR #4723 (0.27.0 - 1.6.x)
_COPIES = "ref_param = model.get_parameter(ref_name)"


def probe(module):
    body = code(module.GRPOTrainer.__init__)
    if _SKIPS in body:
        return not_needed("GRPOTrainer makes no 'ref' adapter for a LoRA config with target_parameters (PR #6043)")
    if 'add_adapter("ref"' not in body:
        return not_needed("GRPOTrainer keeps no 'ref' adapter for a PeftModel (TRL < 0.27)")
    if _MAKES_REF not in body or _COPIES not in body:
        return undecided("GRPOTrainer makes its 'ref' adapter in a way this patch does not know")
    try:
        refuses = refuses_a_second_target_parameters_adapter()
    except ImportError as error:
        return undecided(f"peft's LoRA model cannot be read: {error}")
    if not refuses:
        return not_needed("peft adds a second LoRA adapter with target_parameters: TRL's 'ref' copy is made")
    return needed(
        "GRPOTrainer adds a 'ref' copy of a PeftModel's adapter when beta != 0, and this peft refuses a second LoRA "
        "adapter with target_parameters: ValueError in GRPOTrainer.__init__"
    )


def _skip_ref(model):
    """``model.add_adapter`` and ``model.get_parameter`` for the length of TRL's ``__init__``."""
    cls = type(model)
    skipped = []

    def add_adapter(*args, **kwargs):
        named = arguments(cls.add_adapter, model, *args, **kwargs)
        if named.get("adapter_name") == REF and REF not in model.peft_config and target_parameters_config(model) is not None:
            log.warning(
                "trl_compat: %s: peft cannot add a second LoRA adapter with target_parameters, so GRPOTrainer's frozen "
                "'ref' copy of the adapter is not made: the reference log-probs are the base model's (adapter "
                "disabled), as TRL 1.7 computes them. They match the adapter only while it is freshly initialised "
                "(lora_B zero); for a reference copy of a trained adapter, upgrade peft to 0.20 or later",
                PATCH_ID,
            )
            skipped.append(True)
            return None
        return cls.add_adapter(model, *args, **kwargs)

    def get_parameter(*args, **kwargs):
        try:
            return cls.get_parameter(model, *args, **kwargs)
        except AttributeError:
            target = arguments(cls.get_parameter, model, *args, **kwargs).get("target")
            if not (skipped and isinstance(target, str) and f".{REF}." in target):
                raise
            return cls.get_parameter(model, target.replace(f".{REF}.", ".default."))

    return instance_overrides(model, add_adapter=add_adapter, get_parameter=get_parameter)


def _during(trainer, arguments_by_name):
    model = arguments_by_name.get("model")
    if arguments_by_name.get("peft_config") is not None:
        return contextlib.nullcontext()
    if target_parameters_config(model) is None:
        return contextlib.nullcontext()
    return _skip_ref(model)


apply = around_init(during=_during)
