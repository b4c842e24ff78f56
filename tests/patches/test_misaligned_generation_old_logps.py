"""misaligned-generation-old-logps: slices trained after an optimizer step got no old log-probs (TRL 0.18.0 - 0.19.x).

* A real GRPO run with ``gradient_accumulation_steps=3``, ``steps_per_generation=2`` (learning rate
  0.05, so one optimizer step moves the model): generations at micro-steps 0 and 2; micro-step 3 is
  the first of optimizer step 2 and trains the second half of the generation of micro-step 2.
  Unpatched, its ``old_per_token_logps`` is None (ratio 1), though the generating model's log-probs
  differ from the current model's by more than 0.1 (about 1.1 here); patched (and from 0.20.0), they
  are the generating model's, equal to a recomputation with that model's saved weights, and micro-steps
  0 - 2 (before the optimizer step) are unchanged: old equal to the current log-probs.
* The wrapper on code written here: aligned configurations (3/1, 4/2, 2/2), a batch TRL already gave
  old log-probs, and evaluation are returned untouched.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import copy
import importlib.util
import types

import pytest
from packaging.version import Version

from versions import installed

PID = "misaligned-generation-old-logps"
TRL = installed("trl")
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.18.0") <= TRL < Version("0.20.0")) or not HAVE_TORCH,
    reason=f"TRL {TRL} is outside 0.18.0 - 0.19.x",
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _micro_steps(tmp_path):
    """Per micro-step of a GA=3 / steps_per_generation=2 run: (optimizer steps done, micro-step of the generation
    it trains, old log-probs or None, the generating model's log-probs, the current model's), over completion tokens."""
    import torch

    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, steps=2, gradient_accumulation_steps=3, steps_per_generation=2, learning_rate=0.05)
    generations = []  # (micro-step, weights of the generating model)
    generate = trainer._generate_and_score_completions

    def generate_and_keep(*args, **kwargs):
        output = generate(*args, **kwargs)
        generations.append((trainer._step, copy.deepcopy(trainer.model.state_dict())))
        return output

    steps = []
    compute_loss = trainer._compute_loss

    def recorded(model, inputs):
        generated_at, weights = generations[-1]
        ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        keep = inputs["completion_mask"].bool()
        width = inputs["completion_ids"].size(1)
        with torch.no_grad():
            now = trainer._get_per_token_logps(model, ids, mask, width)
            live = copy.deepcopy(model.state_dict())
            model.load_state_dict(weights)
            then = trainer._get_per_token_logps(model, ids, mask, width)
            model.load_state_dict(live)
        old = inputs["old_per_token_logps"]
        steps.append((trainer.state.global_step, generated_at, None if old is None else old[keep], then[keep], now[keep]))
        return compute_loss(model, inputs)

    trainer._generate_and_score_completions = generate_and_keep
    trainer._compute_loss = recorded
    trainer.train()
    return steps


@needs_bug
def test_bug_without_the_patch_a_stale_slice_gets_ratio_one(tmp_path, unpatched):
    with unpatched(PID):
        steps = _micro_steps(tmp_path)
    assert [(done, generated_at) for done, generated_at, *_ in steps][:4] == [(0, 0), (0, 0), (0, 2), (1, 2)]
    done, generated_at, old, then, now = steps[3]
    assert old is None  # _compute_loss takes the current log-probs: ratio 1
    assert (now - then).abs().max().item() > 0.1  # but the model that generated it was another one


@needs_bug
def test_the_stale_slice_gets_the_generating_models_log_probs(tmp_path):
    import torch

    steps = _micro_steps(tmp_path)
    assert [(done, generated_at) for done, generated_at, *_ in steps][:4] == [(0, 0), (0, 0), (0, 2), (1, 2)]
    for *_, old, then, _now in steps[:4]:
        assert old is not None
        torch.testing.assert_close(old, then, rtol=0, atol=1e-5)
    _, _, old, then, now = steps[3]
    assert (now - old).abs().max().item() > 0.1  # pi_now / pi_generating, as 0.20.0 trains it


class _Loop:
    """What the wrapper reads of TRL's trainer, with a log-prob function that says what it was given."""

    def __init__(self, ga, spg, iterations=1, training=True, old=None):
        self.args = types.SimpleNamespace(gradient_accumulation_steps=ga, steps_per_generation=spg, per_device_train_batch_size=4)
        self.num_iterations = iterations
        self.model = types.SimpleNamespace(training=training)
        self.old = old
        self.calls = []

    def _generate_and_score_completions(self, inputs):
        import torch

        ones = torch.ones(2, 3, dtype=torch.long)
        return {
            "prompt_ids": ones,
            "prompt_mask": ones,
            "completion_ids": 2 * ones,
            "completion_mask": ones,
            "old_per_token_logps": self.old,
        }

    def _get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None):
        self.calls.append((input_ids.tolist(), logits_to_keep, batch_size))
        return "old log-probs"


def _wrapped(trainer):
    from trl_compat.patches import misaligned_generation_old_logps as patch

    trainer._generate_and_score_completions = types.MethodType(patch._wrap(_Loop._generate_and_score_completions), trainer)
    return trainer


@pytest.mark.skipif(not HAVE_TORCH, reason="the wrapper computes the old log-probs with torch")
def test_wrapper_computes_them_only_where_misaligned():
    trainer = _wrapped(_Loop(ga=3, spg=2))
    assert trainer._generate_and_score_completions(inputs=[])["old_per_token_logps"] == "old log-probs"
    assert trainer.calls == [([[1, 1, 1, 2, 2, 2]] * 2, 3, 4)]
    for ga, spg, iterations in [(3, 1, 1), (4, 2, 1), (2, 2, 1), (4, 2, 2)]:
        trainer = _wrapped(_Loop(ga=ga, spg=spg, iterations=iterations))
        assert trainer._generate_and_score_completions([])["old_per_token_logps"] is None and not trainer.calls
    for trainer in (_wrapped(_Loop(ga=3, spg=2, training=False)), _wrapped(_Loop(ga=3, spg=2, old="TRL's"))):
        assert trainer._generate_and_score_completions([])["old_per_token_logps"] == trainer.old and not trainer.calls


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import misaligned_generation_old_logps as patch

    import trl.trainer.grpo_trainer as module

    if not hasattr(module.GRPOTrainer, "_generate_and_score_completions"):
        # the entry's must_exist: the engine reports "not needed" without probing (test_statuses holds it)
        pytest.skip(f"TRL {TRL} has no GRPOTrainer._generate_and_score_completions (it came in 0.16)")
    verdict = patch.probe(module)
    assert verdict.needed is (Version("0.18.0") <= TRL < Version("0.20.0")), verdict


class _Buggy:
    def _generate_and_score_completions(self, inputs):
        if self.num_iterations > 1 or self.args.steps_per_generation > self.args.gradient_accumulation_steps:
            return 1


class _Fixed:
    def _generate_and_score_completions(self, inputs):
        generate_every = self.args.steps_per_generation * self.num_iterations
        if self.args.gradient_accumulation_steps % generate_every != 0:
            return 1


class _Before:
    def _generate_and_score_completions(self, inputs):
        if self.num_iterations > 1:
            return 1


class _Other:
    def _generate_and_score_completions(self, inputs):
        if self.args.steps_per_generation != self.args.gradient_accumulation_steps:
            return 1


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_Before, False), (_Other, None)])
def test_probe_on_code_written_here(cls, needed):
    from trl_compat.patches import misaligned_generation_old_logps as patch

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
