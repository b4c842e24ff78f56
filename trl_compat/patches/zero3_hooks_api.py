"""zero3-hooks-api: re-register the ZeRO-3 hooks under the name the installed DeepSpeed has.

The bug
    ``trl.models.utils.unwrap_model_for_generation`` (gathering on, the
    default) removes DeepSpeed's ZeRO-3 module hooks for generation and puts
    them back afterwards with ``add_hooks(model)``, which calls
    ``optimizer_offload._register_hooks_recursively(optimizer_offload.module)``.
    DeepSpeed 0.16.4 renamed that method of ``DeepSpeedZeRoOffload`` to
    ``_register_deepspeed_module`` (deepspeedai/DeepSpeed PR #6847). With TRL
    0.14.0 to 0.15.2 and DeepSpeed >= 0.16.4, every unwrap of the engine ends in
    ``AttributeError: 'DeepSpeedZeRoOffload' object has no attribute
    '_register_hooks_recursively'`` *after* the hooks were removed: the engine
    is left without its hooks, so a caller that survives the error trains on
    partitioned (empty) weights and fails later with misleading errors such as
    ``RuntimeError: 'weight' must be 2-D``. TRL 0.14.0's GRPOTrainer unwraps
    the engine at every step, so its first step dies; 0.15.x only avoids it
    because it passes the bare module (see zero3-unwrap). TRL 0.16.0 calls
    ``_register_deepspeed_module`` when ``deepspeed.__version__ >= 0.16.4``.

Where it shows: trl 0.14.0 to 0.15.2 (and main-branch installs up to the fix,
reporting 0.16.0.dev0) with deepspeed >= 0.16.4.

How the probe recognises it
    By the code, not by version numbers: the source of TRL's ``add_hooks``
    names ``_register_hooks_recursively`` and not ``_register_deepspeed_module``,
    and the installed ``DeepSpeedZeRoOffload`` class (looked up, nothing is
    initialised) has ``_register_deepspeed_module`` but no
    ``_register_hooks_recursively``. A DeepSpeed with neither, or one that
    cannot be imported, gives "undecided".

The fix
    ``trl.models.utils.add_hooks`` is wrapped: when the model's ZeRO-3
    parameter offload lacks the old method but has the new one, the hooks are
    registered with the new one; in every other case TRL's own ``add_hooks``
    runs unchanged. ``unwrap_model_for_generation`` looks ``add_hooks`` up as a
    module global, so it sees the wrapper.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat drops support for TRL < 0.16.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import zero3
from trl_compat._helpers.source import code

OLD, NEW = zero3.OLD, zero3.NEW


def probe(module):
    source = code(module.add_hooks)
    if NEW in source:
        return not_needed(f"TRL's add_hooks already knows {NEW} (TRL >= 0.16.0 behaviour)")
    if OLD not in source:
        return not_needed(f"TRL's add_hooks does not call {OLD}")
    try:
        cls = zero3.offload_class()
    except Exception as exc:  # noqa: BLE001 - a broken DeepSpeed install is not ours to judge
        return undecided(f"cannot look up DeepSpeedZeRoOffload ({type(exc).__name__}: {exc})")
    has_old, has_new = hasattr(cls, OLD), hasattr(cls, NEW)
    if has_old:
        return not_needed(f"the installed DeepSpeedZeRoOffload still has {OLD}, which TRL's add_hooks calls")
    if not has_new:
        return undecided(f"the installed DeepSpeedZeRoOffload has neither {OLD} nor {NEW}")
    return needed(
        f"TRL's add_hooks calls DeepSpeedZeRoOffload.{OLD}, which the installed DeepSpeed renamed to {NEW} "
        "(DeepSpeed PR #6847): unwrapping a ZeRO-3 engine would fail after removing its hooks"
    )


def _wrap_add_hooks(original):
    @functools.wraps(original)
    def add_hooks(model, *args, **kwargs):
        if zero3.reregister_hooks(model):
            return None
        return original(model, *args, **kwargs)

    return add_hooks


def apply(module, patcher) -> None:
    patcher.wrap(module, "add_hooks", _wrap_add_hooks)
