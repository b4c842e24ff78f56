"""qlora-config-rebuild: every GRPO run on a 4/8-bit model dies in ``GRPOTrainer.__init__`` on TRL 0.22.x.

Upstream: fixed in 0.23.0 by PR #3981, main commit 4c47b3281, 0.23.0.dev0.

The bug (PR #3981; introduced with ``prepare_peft_model`` in GRPO by PR #3882, 65d7894b6,
0.22.0.dev0): for a model loaded in 4 or 8 bits, ``trl.models.utils.prepare_peft_model`` runs
peft's ``prepare_model_for_kbit_training`` and then rebuilds the config with
``args = dataclasses.replace(args, gradient_checkpointing=False)``. ``dataclasses.replace`` calls
``GRPOConfig.__init__`` again with every field, and ``GRPOConfig.__post_init__`` rejects the
``generation_batch_size`` and ``steps_per_generation`` that its first run filled in: ``ValueError:
'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time``.
So QLoRA (a k-bit model with ``peft_config``, or loaded by GRPO with a ``quantization_config``)
cannot start on TRL 0.22.0 - 0.22.2. A k-bit model already wrapped as a ``PeftModel`` is
qlora-peftmodel-frozen's case, which skips the whole branch.

Where it shows: TRL 0.22.0 - 0.22.2 and main-branch builds between 65d7894b6 and 4c47b3281.

Probe: ``prepare_peft_model`` (in ``trl.models.utils``) has ``dataclasses.replace(args,`` and
``GRPOConfig.__post_init__`` raises "can not be both configured". The fixed
``args.gradient_checkpointing = False`` gives "not needed"; a ``trl.models.utils`` without a
``dataclasses`` module binding gives "undecided".

Fix: ``trl.models.utils``'s ``dataclasses`` binding (read only by that one line) becomes a view of
the ``dataclasses`` module whose ``replace`` copies a ``TrainingArguments`` (``copy.copy``, then
the changed fields set) instead of re-running its ``__init__``; every other name and every other
object go to ``dataclasses`` itself. The copy is what the line meant: a local config with gradient
checkpointing off (peft's k-bit preparation enabled it), used only for ``args.bf16`` after it; the
trainer's own config is untouched (TRL 0.23 sets ``args.gradient_checkpointing = False`` on it).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.22.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import types

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "qlora-config-rebuild"
UTILS = "trl.models.utils"
NAME = "dataclasses"

_REBUILD = "dataclasses.replace(args,"
_FIXED = "args.gradient_checkpointing = False"
_REJECTS = "can not be both configured"


def probe(module):
    utils = importlib.import_module(UTILS)
    prepare = getattr(utils, "prepare_peft_model", None)
    if prepare is None:
        return not_needed(f"{UTILS} has no prepare_peft_model")
    source = code(prepare)
    if _FIXED in source:
        return not_needed("prepare_peft_model sets args.gradient_checkpointing = False (fixed code)")
    if _REBUILD not in source:
        return not_needed("prepare_peft_model does not rebuild the config")
    config = getattr(module, "GRPOConfig", None)
    if config is None or _REJECTS not in code(config.__post_init__):
        return not_needed("GRPOConfig.__post_init__ accepts a rebuilt config")
    binding = getattr(utils, NAME, None)
    if binding is not dataclasses and not isinstance(binding, _Dataclasses):  # the module, or this patch's view of it
        return undecided(f"{UTILS}.{NAME} is not the dataclasses module: unknown code")
    return needed(
        "prepare_peft_model rebuilds GRPOConfig with dataclasses.replace for a 4/8-bit model, which "
        "GRPOConfig.__post_init__ rejects (ValueError); the config is copied instead"
    )


def _replace(obj, /, **changes):
    from transformers import TrainingArguments

    if not isinstance(obj, TrainingArguments):
        return dataclasses.replace(obj, **changes)
    for name in changes:
        if name not in {field.name for field in dataclasses.fields(obj)}:
            return dataclasses.replace(obj, **changes)  # dataclasses reports the unknown field
    clone = copy.copy(obj)
    for name, value in changes.items():
        setattr(clone, name, value)
    return clone


class _Dataclasses(types.ModuleType):
    """``dataclasses`` with a ``replace`` that copies a ``TrainingArguments``."""

    def __getattr__(self, name):
        return getattr(dataclasses, name)


def view() -> types.ModuleType:
    shim = _Dataclasses("dataclasses", dataclasses.__doc__)
    shim.replace = _replace  # type: ignore[attr-defined]  # the shim forwards the rest to dataclasses
    return shim


def apply(module, patcher) -> None:
    patcher.replace(importlib.import_module(UTILS), NAME, view())
