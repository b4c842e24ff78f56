"""transformers5-use-cache: ``GRPOTrainer(model="<path>")`` of TRL <= 0.19 passes ``use_cache=None``
into transformers 5's strict configs.

The bug (once transformers5-import lets ``from trl import GRPOTrainer`` work)
    ``GRPOTrainer(model="<path or hub id>")`` sets ``model_init_kwargs["use_cache"] = False if
    args.gradient_checkpointing else model_init_kwargs.get("use_cache")`` (TRL 0.14-0.19), i.e.
    ``None`` unless the user set it, and passes it to ``AutoModelForCausalLM.from_pretrained`` for
    the policy and (beta != 0, no PEFT) the reference model. transformers 5's model configs are
    strict dataclasses: ``huggingface_hub.errors.StrictDataclassFieldValidationError: Validation
    error for field 'use_cache': TypeError: Field 'use_cache' expected bool, got NoneType (value:
    None)``. transformers 4 took ``None`` (the model then fell back to its defaults).
    Upstream: TRL 0.20 rewrote the model loading (PR #3072, 56f4201db, on 0.20.0.dev0) and no
    longer passes ``use_cache`` this way; no TRL release fixes it for 0.14-0.19.
    Where it shows: TRL 0.14.0 - 0.19.x and the 0.20.0.dev0 builds before 56f4201db, transformers >= 5.

How the probe recognises it
    The source of ``GRPOTrainer.__init__`` (comments dropped) contains
    ``model_init_kwargs.get("use_cache")`` and ``AutoModelForCausalLM.from_pretrained(``, the
    module's ``AutoModelForCausalLM`` is transformers' class, and
    ``transformers.LlamaConfig(use_cache=None)`` raises (strict configs). TRL's pattern without
    the strict configs: not needed; the strict configs but an unexpected ``AutoModelForCausalLM``
    binding: undecided.

The fix
    ``AutoModelForCausalLM`` in ``trl.trainer.grpo_trainer``'s namespace (that module's only use
    is the two ``from_pretrained`` calls) becomes a thin proxy whose ``from_pretrained`` drops
    ``use_cache`` when it is ``None`` (= leave the model's default, transformers 4's meaning) and
    passes everything else through; other attributes come from the real class.

transformers5-warnings-issued fixes the other transformers-5 bug of the same ``__init__``;
transformers5-import the one that stops ``from trl import GRPOTrainer``.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat drops TRL < 0.20 on transformers 5 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "transformers5-use-cache"
USE_CACHE_PATTERN = 'model_init_kwargs.get("use_cache")'
LOAD_PATTERN = "AutoModelForCausalLM.from_pretrained("


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
        return f"<trl_compat {PATCH_ID} proxy for {self.__wrapped__!r}>"


def _configs_reject_none_use_cache() -> bool:
    from transformers import LlamaConfig

    try:
        LlamaConfig(use_cache=None)
    except Exception as exc:  # noqa: BLE001 - huggingface_hub's StrictDataclassFieldValidationError is a bare Exception
        return "use_cache" in str(exc)
    return False


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if USE_CACHE_PATTERN not in source:
        return not_needed("GRPOTrainer.__init__ does not pass model_init_kwargs.get('use_cache')")
    if not _configs_reject_none_use_cache():
        return not_needed("transformers' configs accept use_cache=None")
    import transformers

    bound = getattr(module, "AutoModelForCausalLM", None)
    if LOAD_PATTERN not in source or bound is not transformers.AutoModelForCausalLM:
        return undecided(
            "GRPOTrainer.__init__ passes use_cache=None, which transformers' strict configs reject, "
            f"but does not load through the module's AutoModelForCausalLM (found {bound!r})"
        )
    return needed("GRPOTrainer.__init__ passes use_cache=None to from_pretrained; transformers' strict configs reject it")


def apply(module, patcher):
    patcher.replace(module, "AutoModelForCausalLM", DropNoneUseCache(module.AutoModelForCausalLM))
