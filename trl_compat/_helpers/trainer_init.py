"""Acting around ``GRPOTrainer.__init__``: the one wrapper of every patch that corrects what TRL's
``__init__`` is given or leaves behind, instead of each wrapping it its own way (and reading its
arguments by position).

``apply = around_init(before=..., after=...)`` in a patch module, or ``around_init(...)(module, patcher)``
inside an ``apply`` that does more: ``before(trainer, arguments)`` runs before TRL's ``__init__``
(``trainer`` not initialised yet), ``after(trainer, arguments)`` after it; ``during(trainer, arguments)``
returns a context manager that TRL's ``__init__`` runs inside (for a change that must hold while TRL's
code runs and be gone when it returns or raises); ``arguments`` are the call's arguments by name, as
TRL's signature binds them (``{}`` when the call does not bind: TRL then reports it as it always did;
with ``complete=True`` also when it lacks a required argument). The call itself reaches TRL's
``__init__`` untouched.
"""

from __future__ import annotations

import functools
import inspect
from contextlib import AbstractContextManager
from typing import Any, Callable

Hook = Callable[[Any, dict[str, Any]], None]
Around = Callable[[Any, dict[str, Any]], AbstractContextManager[Any]]


def _arguments(signature: inspect.Signature | None, complete: bool, args, kwargs) -> dict[str, Any]:
    if signature is None:
        return {}
    try:
        bound = (signature.bind if complete else signature.bind_partial)(*args, **kwargs)
    except TypeError:
        return {}
    return dict(bound.arguments)


def around_init(*, before: Hook | None = None, after: Hook | None = None, during: Around | None = None, complete: bool = False):
    """The ``apply`` of a patch that wraps ``GRPOTrainer.__init__`` with ``before``/``during``/``after``."""

    def factory(original):
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            signature = None

        @functools.wraps(original)
        def __init__(self, *args, **kwargs):
            arguments = _arguments(signature, complete, (self, *args), kwargs)
            if before is not None:
                before(self, arguments)
            if during is None:
                original(self, *args, **kwargs)
            else:
                with during(self, arguments):
                    original(self, *args, **kwargs)
            if after is not None:
                after(self, arguments)

        return __init__

    def apply(module, patcher) -> None:
        patcher.wrap(module.GRPOTrainer, "__init__", factory)

    return apply
