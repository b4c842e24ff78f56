"""zero3-unwrap at run time: the wrapper around TRL's ``unwrap_model_for_generation``.

Under ZeRO-3, handed a bare module, it unwraps that module's DeepSpeed engine instead (when
TRL's add_hooks can put the hooks back afterwards), gathers without touching hooks where TRL
0.14.0 would crash, and puts the hooks back when the generation block raises.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import sys

from trl_compat import _engine
from trl_compat._helpers import zero3
from trl_compat._helpers.source import SourceUnavailable, code

log = logging.getLogger(__name__)

PATCH_ID = "zero3-unwrap"
GUARD = 'hasattr(model, "optimizer")'


def has_guard(function) -> bool:
    return GUARD in code(function)


def _active() -> bool:
    """Whether the patch is applied; a wrapper captured by a module imported
    after apply() keeps TRL's behaviour once the patch is reverted."""
    try:
        return _engine.status(PATCH_ID) == _engine.APPLIED
    except KeyError:
        return False


def _hooks_can_come_back(offload) -> bool:
    """Handing TRL the engine makes it take the hooks off; do that only if its
    add_hooks can put them back with this DeepSpeed (zero3-hooks-api)."""
    if hasattr(offload, zero3.OLD):
        return True
    try:
        if _engine.status("zero3-hooks-api") == _engine.APPLIED:
            return True
    except KeyError:
        pass
    return zero3.add_hooks_knows_new_name(getattr(sys.modules.get("trl.models.utils"), "add_hooks", None))


def find_engine(model, accelerator):
    """The DeepSpeed engine that wraps ``model`` under ZeRO-3, or None when
    ``model`` is already one (or anything else TRL handles by itself), or when
    the hooks could not be put back afterwards."""
    if not zero3.is_zero3(accelerator) or hasattr(model, "optimizer"):
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
            and isinstance(zero3.hook_list(engine), list)  # a ZeRO-3 offload
        ):
            return engine if _hooks_can_come_back(zero3.offload(engine)) else None
    return None


def _hooks_removed(model, accelerator) -> bool:
    if not zero3.is_zero3(accelerator):
        return False
    hooks = zero3.hook_list(model)
    return isinstance(hooks, list) and not hooks


def _restore_hooks(model) -> None:
    utils = sys.modules.get("trl.models.utils")
    try:
        if utils is None:
            raise ModuleNotFoundError("trl.models.utils is not loaded")
        utils.add_hooks(model)  # the module global: later patches of add_hooks apply
    except Exception as exc:  # noqa: BLE001 - never hide the caller's own exception
        log.warning(
            "trl_compat: %s: could not put the ZeRO-3 hooks back after an error in generation: %s: %s",
            PATCH_ID,
            type(exc).__name__,
            exc,
        )


@functools.cache
def _unguarded(remove_hooks) -> bool:
    """TRL's remove_hooks lacks 0.15's ``hasattr(model, "optimizer")`` guard (0.14.0)."""
    try:
        return not has_guard(remove_hooks)
    except SourceUnavailable:
        return False


@contextlib.contextmanager
def _gathered(model, accelerator):
    """What TRL 0.15's unwrap_model_for_generation does with a module that has
    no engine (its guard makes remove_hooks/add_hooks no-ops): gather, yield."""
    with zero3.gathered(model.parameters()):
        yield accelerator.unwrap_model(model)


def wrap_unwrap(original):
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
                engine is None
                and zero3.is_zero3(accelerator)
                and not hasattr(model, "optimizer")
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
