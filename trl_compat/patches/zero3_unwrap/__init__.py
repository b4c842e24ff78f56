"""zero3-unwrap: unwrapping the bare module under ZeRO-3 uses its DeepSpeed engine.

Main-branch builds: 0.16.0.dev0 installs older than PR #2871 have the bug too.

The bug
    Under DeepSpeed, ``Trainer.model`` stays the bare ``PreTrainedModel``; only
    ``Trainer.model_wrapped`` is the ``DeepSpeedEngine``, and only the engine
    has ``.optimizer``, through which TRL finds the ZeRO-3 hooks to take off
    for generation (``trl.models.utils.remove_hooks``/``add_hooks``, called by
    ``unwrap_model_for_generation`` when it gathers the weights).

    * TRL 0.14.0's ``remove_hooks`` reads ``model.optimizer`` unconditionally:
      any unwrap of the bare module (a user's generation code, a callback, an
      evaluation) dies with ``AttributeError: 'Qwen2ForCausalLM' object has no
      attribute 'optimizer'``. Main-branch installs between TRL PR #2762
      (1f344c937) and PR #2776 (cf97133d5), which report 0.15.0.dev0, pass
      ``self.model`` from ``GRPOTrainer._prepare_inputs``: every GRPO step
      under ZeRO-3 crashes (issue #2782, open-r1 #145/#147).
    * PR #2776 (0.15.0) made ``remove_hooks``/``add_hooks`` return early when
      the model has no ``optimizer``. No crash, but 0.15.0 to 0.15.2 still pass
      the bare module, so the hooks stay in place while generating: every
      generated token runs DeepSpeed's fetch/release machinery on every
      submodule again and re-gathers parameters. PR #2871 (0.16.0) passes
      ``self.model_wrapped`` instead.
    * None of these releases puts the hooks back when generation raises (the
      ``add_hooks`` call is not in a ``finally``): a caller that catches the
      error keeps an engine without hooks.

Where it shows: trl 0.14.0 (bare-module crash), main installs 1f344c937..cf97133d5^
(GRPO crash), 0.15.0 to 0.15.2 and main up to PR #2871 (hooks left in place
during GRPO generation), whenever DeepSpeed ZeRO-3 is used.

How the probe recognises it
    From the code: TRL's ``remove_hooks`` has no ``hasattr(model, "optimizer")``
    guard (the crash), or the GRPO trainer's source (read from the module, or
    from its file without importing it) calls
    ``unwrap_model_for_generation(self.model,`` (the bare module).

The fix
    ``unwrap_model_for_generation`` is replaced, in ``trl.models.utils`` and in
    every already imported ``trl`` module that imported the name, by a wrapper
    that, under ZeRO-3, when handed a module that is not an engine, looks up
    the accelerator's DeepSpeed engine whose ``.module`` is that module and
    unwraps the engine instead (what TRL 0.16 does by passing
    ``model_wrapped``). The hooks are then really removed while generating on
    the gathered weights, and put back afterwards, also when the block raises.
    The engine is not substituted when TRL could not put the hooks back (a
    DeepSpeed >= 0.16.4 without zero3-hooks-api applied); a module with no
    engine (or in that case) is unwrapped as TRL 0.15 does: gathered, hooks
    left alone, instead of 0.14.0's AttributeError. ``remove_hooks`` and
    ``add_hooks`` themselves are not touched (zero3-hooks-api owns
    ``add_hooks``). Anything unexpected falls back to TRL's own behaviour. ``revert()`` restores every binding made at apply time; a
    module imported later (e.g. the GRPO trainer, when ``trl.models.utils``
    was imported first) keeps the wrapper object, which then just calls TRL's
    function.

Parts: this module (probe, apply), ``wrapper`` (the wrapper at run time), on the one
ZeRO-3 helper :mod:`trl_compat._helpers.zero3` that zero3-hooks-api uses too.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR
#2871) (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import os
import sys
import types
import weakref

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import Code, SourceUnavailable, code, normalise
from trl_compat.patches.zero3_unwrap.wrapper import has_guard, wrap_unwrap

NAME = "unwrap_model_for_generation"
BARE_CALL = "unwrap_model_for_generation(self.model,"
_made: weakref.WeakSet = weakref.WeakSet()  # the wrappers this copy of trl_compat made


def _grpo_code():
    """The GRPO trainer's code, without importing it; None if unreadable."""
    module = sys.modules.get("trl.trainer.grpo_trainer")
    if module is not None:
        try:
            return code(module)
        except SourceUnavailable:
            pass
    trl = sys.modules.get("trl")
    for base in getattr(trl, "__path__", None) or ():
        path = os.path.join(base, "trainer", "grpo_trainer.py")
        try:
            with open(path, encoding="utf-8") as handle:
                return Code(normalise(handle.read()))
        except OSError:
            continue
    return None


# -- probe and apply ----------------------------------------------------------------------


def probe(module):
    if not has_guard(module.remove_hooks):
        return needed(
            "trl.models.utils.remove_hooks reads model.optimizer without a guard: unwrapping the bare module "
            "under ZeRO-3 raises AttributeError ... has no attribute 'optimizer'"
        )
    source = _grpo_code()
    if source is None:
        return undecided("cannot read trl/trainer/grpo_trainer.py to see which model GRPO unwraps")
    if BARE_CALL in source:
        return needed(
            "GRPOTrainer unwraps self.model (the bare module, not the DeepSpeed engine): under ZeRO-3 the "
            "hooks stay in place during generation and parameters are re-gathered for every token"
        )
    return not_needed("remove_hooks has the guard and GRPOTrainer unwraps model_wrapped (TRL >= 0.16.0 behaviour)")


def apply(module, patcher) -> None:
    original = getattr(module, NAME)
    wrapper = patcher.wrap(module, NAME, wrap_unwrap)
    _made.add(wrapper)
    # Modules that imported the name before us (trl.models caches it, trainers
    # import it from there); modules imported later get the wrapper anyway, and
    # keep that earlier wrapper after a revert: rebind those too on re-apply.
    for name, other in sorted(sys.modules.items()):
        if other is None or other is module or not (name == "trl" or name.startswith("trl.")):
            continue
        bound = vars(other).get(NAME)
        if bound is original:
            patcher.replace(other, NAME, wrapper, above=original)
        elif isinstance(bound, types.FunctionType) and bound in _made and bound is not wrapper:
            setattr(other, NAME, wrapper)  # our own earlier wrapper: not another copy's
            patcher.on_undo(functools.partial(setattr, other, NAME, bound))
