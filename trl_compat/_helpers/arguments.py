"""A wrapped call's arguments by name: TRL's private signatures change between releases (a
parameter added before another, made keyword-only), so a wrapper that reads an argument reads it
from the call bound to the wrapped function's own signature, never from a position."""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable


@functools.lru_cache(maxsize=256)
def _signature(function: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function without one
        return None


def arguments(function: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """``{name: value}`` of the arguments this call passes to ``function`` (defaults not filled in);
    ``{}`` when ``function`` has no signature or the call does not bind to it."""
    if inspect.ismethod(function):  # a bound method is a new object at each attribute access: cache its function
        args = (function.__self__, *args)
        function = function.__func__
    signature = _signature(function)
    if signature is None:
        return {}
    try:
        return dict(signature.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return {}
