"""transformers5-warnings-issued: ``GRPOTrainer.__init__`` of TRL < 0.27.2 sets
``model.warnings_issued[...]``, which transformers 5.1 removed.

The bug (for TRL < 0.20, once transformers5-import lets ``from trl import GRPOTrainer`` work)
    ``model.warnings_issued["estimate_tokens"] = True`` (TRL 0.14 - 0.27.1): transformers 5.1.0
    removed ``PreTrainedModel.warnings_issued`` (the dict ``PreTrainedModel.__init__`` used to create;
    5.0.0 still creates it, read in both wheels' ``modeling_utils.py``) and nothing in it reads the
    dict any more, so every GRPOTrainer dies with
    ``AttributeError: 'Qwen2ForCausalLM' object has no attribute 'warnings_issued'``.
    Upstream: TRL PR #4960 (main 0eac30dc7; released in 0.27.2) removed the line.
    Window here: trl 0.14.0 - 0.27.1 and the 0.27.2.dev0 builds before 0eac30dc7, transformers >= 5.1
    (and its 5.1.0.dev0 builds). TRL 0.20 - 0.26 on transformers 5 also need peft >= 0.18 (older peft
    imports transformers' removed ``HybridCache``), which is no part of this patch.

How the probe recognises it
    The source of ``GRPOTrainer.__init__`` (comments dropped) contains ``warnings_issued[``,
    ``transformers.PreTrainedModel`` has no ``warnings_issued`` and the code of
    ``transformers.modeling_utils`` never mentions it (so no instance gets one): that tells
    transformers 5.0.0 and the 5.1.0.dev0 builds before the removal (not needed) from 5.1.0.

The fix
    ``PreTrainedModel.warnings_issued`` becomes a non-data descriptor that gives each model its
    own dict on first access (stored in the instance, so later reads and assignments are plain
    attribute accesses). It reaches models the user instantiated and PEFT-wrapped models too.

transformers5-use-cache fixes the other transformers-5 bug of the same ``__init__``.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat drops TRL < 0.27.2 on transformers >= 5.1 (the registry's ``remove_when``; a
test holds the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code

WARNINGS_PATTERN = "warnings_issued["


class WarningsIssued:
    """Non-data descriptor for ``PreTrainedModel.warnings_issued``: a per-model dict, created on
    first access and stored in the instance (where later reads find it before this descriptor)."""

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        return instance.__dict__.setdefault("warnings_issued", {})


@functools.cache
def _mentions_warnings_issued(modeling_utils) -> bool:
    return "warnings_issued" in code(modeling_utils)  # ~280 kB of code: read once


def probe(module):
    if WARNINGS_PATTERN not in code(module.GRPOTrainer.__init__):
        return not_needed("GRPOTrainer.__init__ does not touch model.warnings_issued")
    import transformers.modeling_utils as modeling_utils

    if hasattr(modeling_utils.PreTrainedModel, "warnings_issued"):
        return not_needed("PreTrainedModel has warnings_issued")
    if _mentions_warnings_issued(modeling_utils):
        return not_needed("transformers' models create warnings_issued")
    return needed("GRPOTrainer.__init__ sets model.warnings_issued[...], which transformers' models no longer have")


def apply(module, patcher):
    import transformers.modeling_utils as modeling_utils

    patcher.replace(modeling_utils.PreTrainedModel, "warnings_issued", WarningsIssued())
