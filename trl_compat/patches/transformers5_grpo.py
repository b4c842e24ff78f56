"""transformers5-grpo: ``GRPOTrainer.__init__`` of TRL <= 0.19 on transformers 5.

Remove this patch when trl_compat no longer supports TRL < 0.20 on transformers >= 5.

The bugs (once transformers5-import lets ``from trl import GRPOTrainer`` work)
    1. ``GRPOTrainer(model="<path or hub id>")`` sets
       ``model_init_kwargs["use_cache"] = False if args.gradient_checkpointing else
       model_init_kwargs.get("use_cache")`` (TRL 0.14-0.19), i.e. ``None`` unless the user set it,
       and passes it to ``AutoModelForCausalLM.from_pretrained`` for the policy and (beta != 0, no
       PEFT) the reference model. transformers 5's model configs are strict dataclasses:
       ``huggingface_hub.errors.StrictDataclassFieldValidationError: Validation error for field
       'use_cache': TypeError: Field 'use_cache' expected bool, got NoneType (value: None)``.
       transformers 4 took ``None`` (the model then fell back to its defaults). TRL 0.20 rewrote
       the model loading (PR #3072, 56f4201db, on 0.20.0.dev0) and no longer passes ``use_cache``
       this way.
    2. ``model.warnings_issued["estimate_tokens"] = True`` (TRL 0.14-0.27): transformers 5 removed
       ``PreTrainedModel.warnings_issued`` (the dict ``PreTrainedModel.__init__`` used to create) and
       nothing in it reads the dict any more, so every GRPOTrainer dies with
       ``AttributeError: 'Qwen2ForCausalLM' object has no attribute 'warnings_issued'``.
       Upstream: TRL PR #4960 (0.28.0) removed the line.
    Window here: trl < 0.20 (what trl_compat supports and tests) and its 0.20.0.dev0 builds,
    transformers >= 5.

How the probe recognises them (each part separately, from the real code)
    1. The source of ``GRPOTrainer.__init__`` contains ``model_init_kwargs.get("use_cache")`` and
       ``AutoModelForCausalLM.from_pretrained(``, the module's ``AutoModelForCausalLM`` is
       transformers' class, and ``transformers.LlamaConfig(use_cache=None)`` raises (strict
       configs). TRL's pattern without the strict configs: not needed; the strict configs but an
       unexpected ``AutoModelForCausalLM`` binding: undecided.
    2. The source of ``GRPOTrainer.__init__`` contains ``warnings_issued[``,
       ``transformers.PreTrainedModel`` has no ``warnings_issued`` and the source of
       ``transformers.modeling_utils`` never mentions it (so no instance gets one).

The fixes
    1. ``AutoModelForCausalLM`` in ``trl.trainer.grpo_trainer``'s namespace (that module's only
       use is the two ``from_pretrained`` calls) becomes a thin proxy whose ``from_pretrained``
       drops ``use_cache`` when it is ``None`` (= leave the model's default, transformers 4's
       meaning) and passes everything else through; other attributes come from the real class.
    2. ``PreTrainedModel.warnings_issued`` becomes a non-data descriptor that gives each model its
       own dict on first access (stored in the instance, so later reads and assignments are plain
       attribute accesses). It reaches models the user instantiated and PEFT-wrapped models too.

One patch for both: same trigger (``trl.trainer.grpo_trainer``), same place
(``GRPOTrainer.__init__``), same cause (transformers 5); each part applies only where its
probe finds it. transformers5-import has a different trigger and is separate.

"""

from __future__ import annotations

import functools
from typing import List, Optional, Tuple

from trl_compat._engine import Patch, affected, needed, not_needed, undecided
from trl_compat._source import code

USE_CACHE_PATTERN = 'model_init_kwargs.get("use_cache")'
LOAD_PATTERN = "AutoModelForCausalLM.from_pretrained("
WARNINGS_PATTERN = "warnings_issued["


class DropNoneUseCache:
    """Stands in for ``AutoModelForCausalLM`` in TRL's trainer module: ``from_pretrained``
    without a ``use_cache=None`` (transformers 5's strict configs reject it)."""

    def __init__(self, real):
        self.__wrapped__ = real

    def from_pretrained(self, *args, **kwargs):
        if "use_cache" in kwargs and kwargs["use_cache"] is None:
            del kwargs["use_cache"]
        return self.__wrapped__.from_pretrained(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.__wrapped__, name)

    def __repr__(self):
        return f"<trl_compat transformers5-grpo proxy for {self.__wrapped__!r}>"


class WarningsIssued:
    """Non-data descriptor for ``PreTrainedModel.warnings_issued``: a per-model dict, created on
    first access and stored in the instance (where later reads find it before this descriptor)."""

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return instance.__dict__.setdefault("warnings_issued", {})


def _configs_reject_none_use_cache() -> bool:
    from transformers import LlamaConfig

    try:
        LlamaConfig(use_cache=None)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's StrictDataclassFieldValidationError is a bare Exception
        return "use_cache" in str(exc)
    return False


def _use_cache_part(module, source) -> Tuple[Optional[bool], str]:
    if USE_CACHE_PATTERN not in source:
        return False, "GRPOTrainer.__init__ does not pass model_init_kwargs.get('use_cache')"
    if not _configs_reject_none_use_cache():
        return False, "transformers' configs accept use_cache=None"
    import transformers

    bound = getattr(module, "AutoModelForCausalLM", None)
    if LOAD_PATTERN not in source or bound is not transformers.AutoModelForCausalLM:
        return None, ("GRPOTrainer.__init__ passes use_cache=None, which transformers' strict configs reject, "
                      f"but does not load through the module's AutoModelForCausalLM (found {bound!r})")
    return True, "GRPOTrainer.__init__ passes use_cache=None to from_pretrained; transformers' strict configs reject it"


@functools.lru_cache(maxsize=None)
def _mentions_warnings_issued(modeling_utils) -> bool:
    return "warnings_issued" in code(modeling_utils)  # ~280 kB of code: read once (probe, then apply)


def _warnings_part(source) -> Tuple[bool, str]:
    if WARNINGS_PATTERN not in source:
        return False, "GRPOTrainer.__init__ does not touch model.warnings_issued"
    import transformers.modeling_utils as modeling_utils

    if hasattr(modeling_utils.PreTrainedModel, "warnings_issued"):
        return False, "PreTrainedModel has warnings_issued"
    if _mentions_warnings_issued(modeling_utils):
        return False, "transformers' models create warnings_issued"
    return True, "GRPOTrainer.__init__ sets model.warnings_issued[...], which transformers' models no longer have"


def _parts(module) -> Tuple[List[str], List[str], List[str]]:
    """``(parts needed, reasons, reasons it cannot tell)``."""
    source = code(module.GRPOTrainer.__init__)
    parts, reasons, unclear = [], [], []
    for name, (verdict, reason) in (("use_cache", _use_cache_part(module, source)),
                                    ("warnings_issued", _warnings_part(source))):
        if verdict is None:
            unclear.append(reason)
        elif verdict:
            parts.append(name)
            reasons.append(reason)
        else:
            reasons.append(reason)
    return parts, reasons, unclear


def probe(module):
    parts, reasons, unclear = _parts(module)
    if unclear:
        return undecided("; ".join(unclear))
    if parts:
        return needed("; ".join(reasons))
    return not_needed("; ".join(reasons))


def apply(module, patcher):
    parts, _, unclear = _parts(module)
    if unclear:  # probe said otherwise a moment ago; do nothing rather than half
        raise RuntimeError("; ".join(unclear))
    if "use_cache" in parts:
        patcher.replace(module, "AutoModelForCausalLM", DropNoneUseCache(module.AutoModelForCausalLM))
    if "warnings_issued" in parts:
        import transformers.modeling_utils as modeling_utils

        patcher.replace(modeling_utils.PreTrainedModel, "warnings_issued", WarningsIssued())


# The versions named above, inside the window (the probe decides) or outside it: tests/test_windows.py.
# 0.20.0.dev0 builds carry 0.19's __init__ up to PR #3072 (56f4201db) and warnings_issued up to 0.28.
VERSIONS = {"trl": {"inside": ["0.14.0", "0.19.1", "0.20.0.dev0"], "outside": ["0.20.0", "0.28.0"]},
            "transformers": {"inside": ["5.0.0"], "outside": ["4.57.0"]}}

PATCH = Patch(
    id="transformers5-grpo",
    summary="TRL < 0.20 on transformers 5: GRPOTrainer.__init__ passes use_cache=None and sets model.warnings_issued",
    upstream=("https://github.com/huggingface/trl/pull/4960 (warnings_issued, 0.28.0); "
              "use_cache=None: not passed since TRL 0.20's model loading rewrite"),
    module="trl.trainer.grpo_trainer",
    target="GRPOTrainer",  # the fixes live outside __init__; an inherited __init__ must not count as present
    requires={"trl": affected("0.14.0", "0.20.0"), "transformers": affected("5.0.0")},
    probe=probe,
    apply=apply,
    remove_when="trl_compat drops TRL < 0.20 on transformers 5",
)
