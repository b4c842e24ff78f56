"""zero3-unwrap: unwrapping the bare module under ZeRO-3 uses its DeepSpeed engine.

Remove this patch when trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0
installs older than PR #2871).

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

Affected: trl 0.14.0 (bare-module crash), main installs 1f344c937..cf97133d5^
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

Remove this patch when trl_compat no longer supports TRL < 0.16.0 (and
0.16.0.dev0 installs older than PR #2871).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import types
import weakref

from trl_compat import _engine
from trl_compat._engine import Patch, affected, needed, not_needed, undecided
from trl_compat._source import Code, SourceUnavailable, code, normalise

log = logging.getLogger("trl_compat")

PATCH_ID = "zero3-unwrap"
NAME = "unwrap_model_for_generation"
GUARD = 'hasattr(model, "optimizer")'
BARE_CALL = "unwrap_model_for_generation(self.model,"
_made: "weakref.WeakSet" = weakref.WeakSet()  # the wrappers this copy of trl_compat made


def _has_guard(function) -> bool:
    return GUARD in code(function)


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


# -- runtime -------------------------------------------------------------------------


def _active() -> bool:
    """Whether the patch is applied; a wrapper captured by a module imported
    after apply() keeps TRL's behaviour once the patch is reverted."""
    try:
        return _engine.status(PATCH_ID) == _engine.APPLIED
    except KeyError:
        return False


def _zero3(accelerator) -> bool:
    plugin = getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)
    return plugin is not None and getattr(plugin, "zero_stage", None) == 3


def _offload(engine):
    """What TRL's remove_hooks/add_hooks work on: the ZeRO-3 parameter offload."""
    optimizer = getattr(engine, "optimizer", None)
    if optimizer is None:
        return None
    return getattr(optimizer, "parameter_offload", optimizer)


@functools.lru_cache(maxsize=None)
def _knows_new_name(add_hooks) -> bool:
    try:
        return "_register_deepspeed_module" in code(add_hooks)
    except SourceUnavailable:
        return False


def _hooks_can_come_back(offload) -> bool:
    """Handing TRL the engine makes it take the hooks off; do that only if its
    add_hooks can put them back with this DeepSpeed (zero3-hooks-api)."""
    if hasattr(offload, "_register_hooks_recursively"):
        return True
    try:
        if _engine.status("zero3-hooks-api") == _engine.APPLIED:
            return True
    except KeyError:
        pass
    return _knows_new_name(getattr(sys.modules.get("trl.models.utils"), "add_hooks", None))


def find_engine(model, accelerator):
    """The DeepSpeed engine that wraps ``model`` under ZeRO-3, or None when
    ``model`` is already one (or anything else TRL handles by itself), or when
    the hooks could not be put back afterwards."""
    if not _zero3(accelerator) or hasattr(model, "optimizer"):
        return None
    candidates = []
    wrapped = getattr(accelerator, "deepspeed_engine_wrapped", None)
    if wrapped is not None:
        candidates.append(getattr(wrapped, "engine", None))
    candidates.extend(getattr(accelerator, "_models", None) or ())
    for engine in candidates:
        if (
            engine is not None
            and engine is not model
            and getattr(engine, "module", None) is model
            and isinstance(getattr(_offload(engine), "forward_hooks", None), list)  # a ZeRO-3 offload
        ):
            return engine if _hooks_can_come_back(_offload(engine)) else None
    return None


def _hooks_removed(model, accelerator) -> bool:
    if not _zero3(accelerator):
        return False
    hooks = getattr(_offload(model), "forward_hooks", None)
    return isinstance(hooks, list) and not hooks


def _restore_hooks(model) -> None:
    utils = sys.modules.get("trl.models.utils")
    try:
        utils.add_hooks(model)  # the module global: later patches of add_hooks apply
    except Exception as exc:  # noqa: BLE001 - never hide the caller's own exception
        log.warning("trl_compat: %s: could not put the ZeRO-3 hooks back after an error in generation: %s: %s",
                    PATCH_ID, type(exc).__name__, exc)


@functools.lru_cache(maxsize=None)
def _unguarded(remove_hooks) -> bool:
    """TRL's remove_hooks lacks 0.15's ``hasattr(model, "optimizer")`` guard (0.14.0)."""
    try:
        return not _has_guard(remove_hooks)
    except SourceUnavailable:
        return False


@contextlib.contextmanager
def _gathered(model, accelerator):
    """What TRL 0.15's unwrap_model_for_generation does with a module that has
    no engine (its guard makes remove_hooks/add_hooks no-ops): gather, yield."""
    import deepspeed

    with deepspeed.zero.GatheredParameters(model.parameters()):
        yield accelerator.unwrap_model(model)


def _wrap_unwrap(original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    def gathers(model, accelerator, args, kwargs) -> bool:
        """Whether TRL would gather (and so call remove_hooks) for these arguments;
        False when they cannot be read or ask for PEFT handling (TRL decides)."""
        if signature is None:
            return False
        try:
            arguments = signature.bind(model, accelerator, *args, **kwargs).arguments
        except TypeError:
            return False
        return bool(arguments.get("gather_deepspeed3_params", True)) and not arguments.get("is_peft_model")

    @functools.wraps(original)
    @contextlib.contextmanager
    def unwrap_model_for_generation(model, accelerator, *args, **kwargs):
        if not _active():
            with original(model, accelerator, *args, **kwargs) as unwrapped:
                yield unwrapped
            return
        engine = no_engine_crash = None
        try:
            engine = find_engine(model, accelerator)
            no_engine_crash = (
                engine is None and _zero3(accelerator) and not hasattr(model, "optimizer")
                and _unguarded(getattr(sys.modules.get("trl.models.utils"), "remove_hooks", None))
                and gathers(model, accelerator, args, kwargs)
            )
        except Exception:  # noqa: BLE001 - unexpected objects: TRL's behaviour
            engine = no_engine_crash = None
        if no_engine_crash:
            # TRL 0.14 would raise AttributeError ... 'optimizer'; 0.15 leaves the hooks alone.
            with _gathered(model, accelerator) as unwrapped:
                yield unwrapped
            return
        target = model if engine is None else engine
        with original(target, accelerator, *args, **kwargs) as unwrapped:
            try:
                yield unwrapped
            except BaseException:
                # TRL calls add_hooks after the yield, not in a finally: put the hooks
                # back here, still inside its GatheredParameters, as it would have.
                if _hooks_removed(target, accelerator):
                    _restore_hooks(target)
                raise

    return unwrap_model_for_generation


# -- probe and apply ----------------------------------------------------------------------


def probe(module):
    if not _has_guard(module.remove_hooks):
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
    wrapper = patcher.wrap(module, NAME, _wrap_unwrap)
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


# The versions named above, inside the window (the probe decides) or outside it: tests/test_windows.py.
VERSIONS = {"trl": {"inside": ["0.14.0", "0.15.0.dev0", "0.15.0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}}

PATCH = Patch(
    id=PATCH_ID,
    summary=(
        "under ZeRO-3, unwrapping the bare module uses its DeepSpeed engine: no AttributeError, hooks really "
        "removed during generation and restored (also on error)"
    ),
    upstream=(
        "https://github.com/huggingface/trl/issues/2782 (crash; guard in PR #2776, 0.15.0); "
        "hooks left in place fixed by PR #2871 in 0.16.0"
    ),
    module="trl.models.utils",
    target=NAME,
    requires={"trl": affected("0.14.0", "0.16.0"), "deepspeed": ">=0"},
    probe=probe,
    apply=apply,
    remove_when="trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR #2871)",
)
