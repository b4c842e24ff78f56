"""num-generations-eval-check: the eval batch is checked against ``num_generations_eval``, not ``num_generations``.

The bug (PR #4682, ``8bc520d36``, cherry-picked as ``2f62f3d03``, fixed in 0.26.1): TRL 0.26.0 added
``GRPOConfig.num_generations_eval`` (the trainer evaluates with ``num_generations_eval or
num_generations`` completions per prompt), but ``GRPOConfig.__post_init__`` still checked the global
eval batch against ``num_generations``. Both ways it is wrong:

* a valid config is refused: ``num_generations=4, num_generations_eval=2,
  per_device_eval_batch_size=2`` raises ``ValueError: The global eval batch size (2 * 1) must be
  divisible by num_generations (4).``;
* an invalid one passes and crashes at the first evaluation: ``num_generations=2,
  num_generations_eval=4, per_device_eval_batch_size=2`` builds, and ``evaluate()`` (or the first
  eval step of ``train()``) raises ``RuntimeError: shape '[-1, 4]' is invalid for input of size 2``
  where the rewards are grouped.

Upstream fix: ``num_generations = self.num_generations_eval or self.num_generations`` before the
check, and the message names "the number of generations used for evaluation".

Probe: ``GRPOConfig`` has a ``num_generations_eval`` field and its ``__post_init__`` checks
``(self.per_device_eval_batch_size * num_processes) % self.num_generations``: "needed"; the fixed
``self.num_generations_eval or self.num_generations``, or a release without the field: "not needed";
anything else: "undecided".

Fix: where ``num_generations_eval`` is set and differs from ``num_generations``, TRL's
``__post_init__`` runs with ``per_device_eval_batch_size`` set to ``num_generations`` for its
duration (a batch its wrong check accepts; nothing else in it reads that field), the user's value is
put back, and then the check 0.26.1 makes is made, with 0.26.1's message. Every other config runs
TRL's ``__post_init__`` untouched.

Run time: load-bearing: errors propagate. The wrapper's ``ValueError`` is the check itself, and
falling back to TRL's own code on an error would be the bug, unnoticed.

Delete when: trl_compat no longer supports TRL 0.26.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

SETTING = "num_generations_eval"
BUGGY = "(self.per_device_eval_batch_size * num_processes) % self.num_generations != 0"
FIXED = "self.num_generations_eval or self.num_generations"


def probe(module):
    config = module.GRPOConfig
    if SETTING not in getattr(config, "__dataclass_fields__", {}):
        return not_needed(f"GRPOConfig has no {SETTING}")
    source = code(config.__post_init__)
    if FIXED in source:
        return not_needed(f"GRPOConfig.__post_init__ checks the eval batch against {FIXED}")
    if BUGGY in source:
        return needed(
            "GRPOConfig.__post_init__ checks the global eval batch against num_generations, not num_generations_eval: "
            "the check is made against the number evaluation uses instead"
        )
    return undecided(f"GRPOConfig.__post_init__ checks the eval batch in a way this patch does not know ({SETTING})")


def check_eval_batch(config) -> None:
    """The check of TRL 0.26.1's ``GRPOConfig.__post_init__``, word for word in its message."""
    if config.do_eval and config.eval_strategy != "no":
        num_generations = config.num_generations_eval or config.num_generations
        num_processes = config.world_size
        if (config.per_device_eval_batch_size * num_processes) % num_generations != 0:
            raise ValueError(
                f"The global eval batch size ({config.per_device_eval_batch_size} * {num_processes}) must be "
                f"divisible by the number of generations used for evaluation ({num_generations})."
            )


def _wrap_post_init(original):
    @functools.wraps(original)
    def __post_init__(self, *args, **kwargs):
        eval_generations = getattr(self, SETTING, None)
        if not eval_generations or eval_generations == self.num_generations:
            return original(self, *args, **kwargs)  # TRL's own check is the right one here
        # TRL checks the eval batch against num_generations: it is handed a batch that check accepts
        # (num_generations * any process count) and the user's batch is checked after, as 0.26.1 does.
        asked = self.per_device_eval_batch_size
        self.per_device_eval_batch_size = self.num_generations
        try:
            result = original(self, *args, **kwargs)
        finally:
            self.per_device_eval_batch_size = asked
        check_eval_batch(self)
        return result

    return __post_init__


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOConfig, "__post_init__", _wrap_post_init)
