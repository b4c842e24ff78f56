"""none-reward-warning-state: on TRL 0.20 - 0.21, a completion that every reward function declines
(returns ``None`` for) crashes the step with ``TypeError: 'TrainerState' object is not subscriptable``.

The bug
    From 0.16.0 a reward function may return ``None`` for a completion it cannot score, and
    ``GRPOTrainer._calculate_rewards`` warns when a row is ``None`` for every function, naming that
    row's reward kwargs: ``{key: value[nan_row_idx] for key, value in reward_kwargs.items()}``. PR
    #3669 (first in 0.20.0) added ``reward_kwargs["trainer_state"] = self.state`` (reward shaping by
    training progress), a ``TrainerState``, which takes no index: the warning itself raises, before
    the rewards are gathered, and the run dies at the first batch with such a row. Multi-task
    datasets (a math verifier that declines code prompts, and the reverse) reach it as soon as one
    completion is declined by all of them.
    Upstream: TRL PR #3936 (``e2eaa2334``, first in 0.22.0) leaves ``trainer_state`` out of the
    warning's kwargs.

How the probe recognises it
    ``GRPOTrainer._calculate_rewards`` (comments dropped) puts ``self.state`` into
    ``reward_kwargs["trainer_state"]`` and builds the warning's kwargs by indexing every value
    (``value[nan_row_idx] for key, value in reward_kwargs.items()}``): needed. It skips the key
    (``if key != "trainer_state"``, 0.22 - 0.29; ``if key not in ("trainer_state", ...)``, 1.0 on):
    not needed. No ``trainer_state`` in the reward kwargs (TRL
    < 0.20): not needed. Anything else: undecided.

The fix
    ``GRPOTrainer._calculate_rewards`` is wrapped. For the length of the call the trainer's state
    object takes a subclass of its own class that answers an index with a one-line name of the
    state (``<TrainerState at global_step 3>``), so TRL's warning is written (naming that, not the
    whole state) and the call goes on to gather the rewards; the class is put back when the call
    returns or raises. The reward functions get the same object as
    without the patch (its identity, attributes and ``isinstance`` hold; only ``type()`` names the
    subclass during the call). A state object whose class cannot be swapped (``__slots__``, an
    extension type) is left as it is, with a warning, and TRL raises its own error.

Run time: load-bearing: errors propagate. The class swap is the fix; an error falling back to TRL's
own code would be the crash again (``trl_compat._engine.guarded``).

Delete when: TRL < 0.22.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import functools
import logging

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

log = logging.getLogger(__name__)

PATCH_ID = "none-reward-warning-state"
METHOD = "_calculate_rewards"

_STATE_KWARG = 'reward_kwargs["trainer_state"] = self.state'
_INDEXES_EVERY_KWARG = "value[nan_row_idx] for key, value in reward_kwargs.items()}"
# 0.22 - 0.29: one key left out; 1.0 on: a tuple of them ("trainer_state", "log_extra", "log_metric")
_SKIPS_STATE = ('if key != "trainer_state"', 'if key not in ("trainer_state"')


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return not_needed(f"GRPOTrainer has no {METHOD}: no trainer_state among the reward kwargs (TRL < 0.19)")
    source = code(method)
    if _STATE_KWARG not in source:
        return not_needed("the reward kwargs carry no trainer_state (TRL < 0.20)")
    if any(skip in source for skip in _SKIPS_STATE):
        return not_needed("the all-None warning leaves trainer_state out (fixed code)")
    if _INDEXES_EVERY_KWARG in source:
        return needed(
            "the warning for a row every reward function declined indexes every reward kwarg, trainer_state "
            "too: TypeError 'TrainerState' object is not subscriptable"
        )
    return undecided(f"GRPOTrainer.{METHOD} writes the all-None warning in a way this patch does not know")


@functools.cache
def indexable(cls: type) -> type:
    """``cls`` whose instances answer any index with a one-line name of themselves (what TRL's warning
    then prints for ``trainer_state``, instead of the whole state), one subclass per class."""

    def __getitem__(self, index):
        return f"<{cls.__name__} at global_step {getattr(self, 'global_step', '?')}>"

    return type(cls.__name__, (cls,), {"__getitem__": __getitem__, "__module__": cls.__module__})


def _swap_class(state, cls: type) -> bool:
    try:
        state.__class__ = cls
    except TypeError:
        return False
    return True


def _wrap(original):
    @functools.wraps(original)
    def _calculate_rewards(self, *args, **kwargs):
        state = getattr(self, "state", None)
        own = type(state)
        if state is None or hasattr(own, "__getitem__"):
            return original(self, *args, **kwargs)
        if not _swap_class(state, indexable(own)):
            log.warning(
                "trl_compat: %s: the trainer's state (%s) takes no other class; a row every reward function "
                "declines will crash TRL's warning",
                PATCH_ID,
                own.__name__,
            )
            return original(self, *args, **kwargs)
        try:
            return original(self, *args, **kwargs)
        finally:
            state.__class__ = own

    return _calculate_rewards


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap)
