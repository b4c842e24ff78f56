"""resume-buffered-inputs: TRL 0.16.x resumes a ``num_iterations > 1`` run from a checkpoint.

Main-branch builds: 0.17.0.dev0 builds from before PR #3148, commit 488025cd8 have the bug too.

The bug (TRL PR #3148, no issue filed): with ``num_iterations > 1`` (multiple GRPO updates per
generation, added in 0.16.0 by PR #2899), ``GRPOTrainer._prepare_inputs`` generates only when
``state.global_step % num_iterations == 0`` and otherwise returns
``self._buffered_inputs[self._step % gradient_accumulation_steps]``, a buffer that lives in
memory only. A run resumed from a checkpoint saved mid-iteration (``global_step %
num_iterations != 0``) starts with a buffer of ``None`` and hands ``None`` to ``compute_loss``:
``train(resume_from_checkpoint=...)`` dies at the first resumed step with
``TypeError: 'NoneType' object is not subscriptable``. TRL 0.17.0 generates when the buffered
slot is ``None``.

Where it shows: TRL 0.16.0, 0.16.1 and the main-branch builds between PR #2899 and PR #3148
(0.16.0.dev0, 0.17.0.dev0).

Probe: the source of ``GRPOTrainer._prepare_inputs`` reuses ``self._buffered_inputs[...]``
whenever ``self.state.global_step % self.num_iterations`` is not 0 and never tests the buffer
for ``None``. Code that tests for ``None`` (0.17.0 on) or has no such buffer: not needed.

Fix: in training, when the slot ``_prepare_inputs`` would read is ``None`` (only possible
before the first generation of a resumed run), the wrapper does what TRL 0.17.0 does:
generate and score on the batch the dataloader gave, buffer it in that slot, advance
``_step``. Every other call reaches TRL's method untouched.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.16.x (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "resume-buffered-inputs"

REUSES = "inputs = self._buffered_inputs[self._step % self.args.gradient_accumulation_steps]"
GATE = "if self.state.global_step % self.num_iterations == 0:"


def probe(module):
    source = code(module.GRPOTrainer._prepare_inputs)
    if "_buffered_inputs" not in source:
        return not_needed("GRPOTrainer._prepare_inputs buffers no generations (no num_iterations reuse)")
    if "is None" in source:
        return not_needed("GRPOTrainer._prepare_inputs generates when its buffer is None")
    if REUSES in source and GATE in source:
        return needed(
            "GRPOTrainer._prepare_inputs reuses self._buffered_inputs whenever global_step % "
            "num_iterations != 0, never checking for None: a run resumed mid-iteration gets None inputs"
        )
    return undecided("GRPOTrainer._prepare_inputs buffers generations in a form trl_compat does not know")


def _prepare_inputs_factory(original):
    @functools.wraps(original)
    def _prepare_inputs(self, *args, **kwargs):
        if getattr(self, "control", None) is not None and not self.control.should_evaluate:
            buffered = getattr(self, "_buffered_inputs", None)
            accumulation = self.args.gradient_accumulation_steps
            slot = self._step % accumulation
            if (
                isinstance(buffered, list)
                and slot < len(buffered)
                and buffered[slot] is None
                and self.state.global_step % self.num_iterations != 0
                and len(args) == 1
                and not kwargs
            ):
                # Resumed mid-iteration: nothing generated in this process yet. TRL 0.17.0 regenerates here.
                inputs = self._generate_and_score_completions(args[0])
                buffered[slot] = inputs
                self._step += 1
                return inputs
        return original(self, *args, **kwargs)

    return _prepare_inputs


def apply(module, patcher):
    patcher.wrap(module.GRPOTrainer, "_prepare_inputs", _prepare_inputs_factory)
