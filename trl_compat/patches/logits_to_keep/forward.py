"""The per-instance forward wrapper, and its undo.

The change is made on the innermost model *instance's* ``forward`` (a method bound to that
instance, so ``copy.deepcopy`` rebinds it), not with a forward pre-hook: PEFT's
``BaseTuner.forward`` (peft <= 0.17) calls ``self.model.forward(...)`` directly, which bypasses
module hooks. ``inspect.signature(model.forward)`` stays as it was. Switching the patch off
(``revert()``) restores the original ``forward`` of every model it changed; a wrapper that
something else has wrapped again meanwhile is switched to pass-through instead.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import threading
import types
import weakref
from typing import Any

from trl_compat._helpers.models import peel
from trl_compat.patches.logits_to_keep.accepts import Accepts
from trl_compat.patches.logits_to_keep.trl_call import NAMES, NEW, OLD, PATCH_ID, TrlCall

log = logging.getLogger(__name__)

_PREV = "_trl_compat_logits_to_keep_prev_forward"  # the forward ours replaced; None = the class's
_MISSING = object()


class _Switch:
    """On while the patch is applied. ``active`` holds the TrlCall facts.

    apply() turns it on by setting ``active`` and off (``patcher.on_undo``) by
    deleting that attribute; deleting it also restores the forward of every
    model we changed, so ``revert()`` leaves nothing behind."""

    active: TrlCall | None = None

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        if name == "active":
            unwrap_all()


SWITCH = _Switch()
LOCK = threading.RLock()
_wrapped: weakref.WeakSet[Any] = weakref.WeakSet()


def _keep_last(logits, keep):
    """transformers' own slicing: int k keeps the last k (0 = all); a tensor picks positions."""
    if isinstance(keep, numbers.Integral):
        return logits[:, -int(keep) :, :] if keep > 0 else logits
    return logits[:, keep, :]


class _KeepLogitsForward:
    """Bound to one model instance as its ``forward``.

    Holds no reference to the instance (``copy.deepcopy`` rebinds the method and
    the ``_PREV`` attribute to the copy)."""

    def __init__(self, accepted: Accepts, wrapped, signature: inspect.Signature | None):
        self.accepted = accepted
        self.__wrapped__ = wrapped  # the function underneath, for accelerate's unwrapping
        if signature is not None:
            self.__signature__ = signature  # inspect.signature(model.forward) stays as it was
        self.__name__ = "forward"
        self.__qualname__ = getattr(wrapped, "__qualname__", "forward")
        self.__doc__ = getattr(wrapped, "__doc__", None)
        self.__module__ = getattr(wrapped, "__module__", __name__)
        self.__trl_compat_patch__ = PATCH_ID

    def __call__(self, module, *args, **kwargs):
        prev = module.__dict__.get(_PREV, None)
        call = prev if prev is not None else types.MethodType(type(module).forward, module)
        if SWITCH.active is None or not any(name in kwargs for name in NAMES):
            return call(*args, **kwargs)
        names, var_kw = self.accepted
        target = NEW if NEW in names else (OLD if OLD in names else None)
        keep = _MISSING
        for name in NAMES:
            if name not in kwargs or name in names:
                continue
            if target is None:  # takes neither: cut the logits ourselves afterwards
                keep = kwargs[name]
                if not var_kw:  # it would raise TypeError; with **kwargs it may still pass it on and honour it
                    kwargs.pop(name)
                continue
            value = kwargs.pop(name)
            if target in kwargs:
                continue  # the model's own name wins, as with transformers' deprecate_kwarg
            if target == NEW or isinstance(value, numbers.Integral):
                kwargs[target] = value
            else:  # num_logits_to_keep only ever took an int
                keep = value
        out = call(*args, **kwargs)
        if keep is _MISSING:
            return out
        logits = getattr(out, "logits", None)
        if logits is None or getattr(logits, "dim", lambda: 0)() != 3:
            log.warning("trl_compat: %s: %s returned no 3-d `logits`; left as it is", PATCH_ID, type(module).__name__)
            return out
        out.logits = _keep_last(logits, keep)  # ModelOutput keeps attribute and key in step
        return out


def _ours(forward) -> bool:
    """Whether ``forward`` is our wrapper, possibly under other wrappers."""
    for _ in range(32):
        if forward is None:
            return False
        if isinstance(getattr(forward, "__func__", None), _KeepLogitsForward) or isinstance(forward, _KeepLogitsForward):
            return True
        forward = getattr(forward, "__wrapped__", None)
    return False


def _with_self(sig: inspect.Signature) -> inspect.Signature:
    first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return sig.replace(parameters=[first, *sig.parameters.values()])


def wrap(inner, accepted: Accepts) -> None:
    """Put ours on ``inner``'s (the innermost model's) forward, unless it is there already."""
    if _ours(inner.__dict__.get("forward")):
        _wrapped.add(inner)  # e.g. a deepcopy of a wrapped model: revert() restores it too
        return
    prev = inner.__dict__.get("forward", None)
    underlying = prev.__func__ if isinstance(prev, types.MethodType) else (prev or type(inner).forward)
    try:
        signature = _with_self(inspect.signature(inner.forward))
    except (TypeError, ValueError):
        signature = None
    inner.__dict__[_PREV] = prev
    inner.forward = types.MethodType(_KeepLogitsForward(accepted, underlying, signature), inner)
    _wrapped.add(inner)


def unwrap(model: Any) -> bool:
    """Restore the innermost model's original ``forward`` if ours is on top; True if restored."""
    inner = peel(model)
    with LOCK:
        current = inner.__dict__.get("forward", None)
        if not (isinstance(current, types.MethodType) and isinstance(current.__func__, _KeepLogitsForward)):
            return False  # not ours, or someone wrapped ours again: ours passes through while switched off
        prev = inner.__dict__.pop(_PREV, None)
        if prev is None:
            del inner.forward
        else:
            inner.forward = prev
        _wrapped.discard(inner)
        return True


def unwrap_all() -> None:
    for model in list(_wrapped):
        try:
            unwrap(model)
        except Exception:  # reverting must go on for the other models
            log.warning("trl_compat: %s: could not restore %s.forward", PATCH_ID, type(model).__name__, exc_info=True)


def wrapped_models() -> list[Any]:
    return list(_wrapped)
