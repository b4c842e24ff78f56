"""reward-func-partial-name: a ``functools.partial`` or a callable instance as reward function
crashes GRPO with ``AttributeError: 'functools.partial' object has no attribute '__name__'``.

The bug
    GRPOTrainer names each reward function for its metrics (``rewards/<name>/mean``) with
    ``reward_func.__name__``: TRL 0.14 - 0.16 at the first step (``_prepare_inputs``/
    ``_generate_and_score_completions``, ``reward_func_name = reward_func.__name__``), TRL 0.17 -
    1.8 in ``__init__`` (``self.reward_func_names.append(reward_funcs[i].__name__)``). A
    ``functools.partial`` (the usual way to give a reward function its settings, and the
    picklable one) and an instance of a class with ``__call__`` have no ``__name__``: the run dies
    with ``AttributeError`` before it trains (0.17+: in ``GRPOTrainer(...)``).
    Upstream: TRL PR #6313 (main ``bc6e8007b``, first in 1.9.0) names them with
    ``trl.trainer.utils.get_callable_name``: a partial by the function it wraps (unwrapped
    through nested partials), anything else without ``__name__`` by its class name.

How the probe recognises it
    ``GRPOTrainer``'s code (comments dropped) calls ``get_callable_name(``: not needed. It reads
    ``reward_funcs[i].__name__`` or ``reward_func.__name__``: needed. Neither: undecided (TRL
    names reward functions some other way, which this patch does not know).

The fix
    ``GRPOTrainer.__init__`` is wrapped (``_helpers.trainer_init``). Before TRL's ``__init__``
    runs, each reward function passed in (the ``reward_funcs`` argument, a callable or a list)
    that is neither a module nor a string and has no ``__name__`` gets one: the name TRL 1.9's
    ``get_callable_name`` gives it. The object itself is kept (TRL still calls it, tests it for a
    coroutine function, pickles it), only the attribute is added; it stays after a revert, as
    harmless as TRL 1.9's name. An object that takes no attribute (``__slots__``) is left as it
    is, with a warning: TRL then raises its own error.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.9.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import logging
import sys

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

PATCH_ID = "reward-func-partial-name"
_READS_NAME = ("reward_funcs[i].__name__", "reward_func.__name__")


def probe(module):
    body = code(module.GRPOTrainer)
    if "get_callable_name(" in body:
        return not_needed("GRPOTrainer names reward functions with get_callable_name (partials and instances too)")
    if any(needle in body for needle in _READS_NAME):
        return needed(
            "GRPOTrainer names each reward function by its __name__, which a functools.partial or a callable "
            "instance lacks: AttributeError before training"
        )
    return undecided("GRPOTrainer reads neither reward_func.__name__ nor get_callable_name: unknown naming")


def callable_name(func) -> str:
    """TRL 1.9's ``get_callable_name``: a partial by the function it wraps, else ``__name__`` or the class name."""
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__name__", type(func).__name__)


def _needs_name(func) -> bool:
    if isinstance(func, str) or not callable(func) or hasattr(func, "__name__"):
        return False
    torch = sys.modules.get("torch")  # loaded with TRL; a reward model is a torch module
    return torch is None or not isinstance(func, torch.nn.Module)  # TRL names a reward model by its config


def name_reward_funcs(reward_funcs) -> None:
    """Give each reward function of ``reward_funcs`` (one or a list) without ``__name__`` TRL 1.9's name."""
    for func in reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]:
        if not _needs_name(func):
            continue
        try:
            func.__name__ = callable_name(func)
        except (AttributeError, TypeError):
            log.warning(
                "trl_compat: %s: cannot name the reward function %r (it takes no attributes); TRL will fail on its __name__",
                PATCH_ID,
                func,
            )


def _before(trainer, arguments) -> None:
    name_reward_funcs(arguments.get("reward_funcs"))


apply = around_init(before=_before)
