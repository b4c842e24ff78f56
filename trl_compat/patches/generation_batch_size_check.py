"""generation-batch-size-check: a ``generation_batch_size`` the global batch does not divide is refused, as TRL 0.19.1 does.

The bug (PR #3658, ``9155c8fbb``, cherry-picked as ``6a6d4345c``, fixed in 0.19.1): from TRL 0.18.0
(``cf5183db7``, PR #3388, which brought ``generation_batch_size``) to 0.19.0, ``GRPOConfig.__post_init__``
checks ``self.generation_batch_size % self.per_device_train_batch_size * num_processes != 0``, which
Python reads as ``(generation_batch_size % per_device_train_batch_size) * num_processes``: on several
processes only the per-device batch must divide the generation batch. A ``generation_batch_size`` of
6 with 2 per device on 2 processes (a global batch of 4) passes, and ``steps_per_generation = 6 // 4 =
1``: the sampler hands out chunks of 6 completions (3 prompts) while each step takes 4 of them, so the
steps cut across the chunks:

* where the global batch is not a multiple of ``num_generations`` (``num_generations=3``), a prompt's
  group straddles two steps and the first step raises ``RuntimeError: shape '[-1, 3]' is invalid for
  input of size 4`` where the rewards are grouped;
* with ``num_iterations > 1`` the sampler repeats each chunk while the trainer generates once every
  ``num_iterations`` steps from what the step it generates at drew: some prompts are never trained
  on and others twice (silently; figures in the tests).

Upstream fix: parentheses, ``generation_batch_size % (per_device_train_batch_size * num_processes)``.

Probe: ``GRPOConfig.__post_init__`` holds the unparenthesised check: "needed"; the parenthesised
one, or no such check (TRL < 0.18): "not needed"; another form: "undecided".

Fix: after TRL's ``__post_init__``, the check 0.19.1 makes, with its message: a config whose global
batch does not divide ``generation_batch_size`` raises ``ValueError`` when it is built. On one
process the two checks agree, so such a config is refused there already and nothing changes.

Run time: load-bearing: errors propagate. The wrapper's ``ValueError`` is the check itself, and
falling back to TRL's own code on an error would be the bug, unnoticed.

Delete when: trl_compat no longer supports TRL < 0.19.1 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

BUGGY = "self.generation_batch_size % self.per_device_train_batch_size * num_processes != 0"
FIXED = "self.generation_batch_size % (self.per_device_train_batch_size * num_processes) != 0"


def probe(module):
    source = code(module.GRPOConfig.__post_init__)
    if BUGGY in source:
        return needed(
            "GRPOConfig.__post_init__ reads generation_batch_size % per_device_train_batch_size * num_processes "
            "(precedence): on several processes a generation batch the global batch does not divide passes; "
            "the check 0.19.1 makes follows"
        )
    if FIXED in source or "generation_batch_size" not in source:
        return not_needed("GRPOConfig.__post_init__ checks generation_batch_size against the global batch (or has none)")
    return undecided("GRPOConfig.__post_init__ checks generation_batch_size in a way this patch does not know")


def check_generation_batch(config) -> None:
    """The check of TRL 0.19.1's ``GRPOConfig.__post_init__``, word for word in its message."""
    global_batch = config.per_device_train_batch_size * config.world_size
    if config.generation_batch_size % global_batch != 0:
        raise ValueError(
            f"generation_batch_size ({config.generation_batch_size}) must be divisible by the global batch size ({global_batch})."
        )


def _wrap_post_init(original):
    @functools.wraps(original)
    def __post_init__(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        check_generation_batch(self)
        return result

    return __post_init__


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOConfig, "__post_init__", _wrap_post_init)
