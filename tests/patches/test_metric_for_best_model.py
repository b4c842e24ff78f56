"""metric-for-best-model: ``metric_for_best_model="reward"`` was not found (TRL 0.15.0 - 1.4.x).

* A real tiny GRPO run of 2 steps with an evaluation and a checkpoint at each step,
  ``metric_for_best_model="reward"`` and ``load_best_model_at_end=True``.
* Without the patch (in the window): ``train()`` stops at the first evaluation with transformers'
  ``KeyError`` naming ``'eval_reward'``, and ``evaluate()`` returns ``eval_loss`` and the timings only.
* With it: ``evaluate()`` returns every key of its logged entry (``eval_reward`` the logged value,
  ``step`` apart); the run completes, ``state.best_metric`` is the larger of the two logged
  ``eval_reward`` values and ``best_model_checkpoint`` is that step's checkpoint.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import importlib.util
import os

from trl_compat.patches import metric_for_best_model as patch  # imports trl_compat before any test imports TRL

import pytest
from packaging.version import Version

from versions import installed

PID = "metric-for-best-model"
TRL = installed("trl")
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
BUGGY = TRL is not None and Version("0.15.0") <= TRL < Version("1.5.0")

needs_eval = pytest.mark.skipif(
    TRL is None or TRL < Version("0.15.0") or not HAVE_TORCH, reason=f"TRL {TRL}: GRPO evaluates from 0.15.0"
)
# TRL 0.16 - 0.17 pick the metrics a log() call reports by control.should_evaluate, which only train()'s own
# evaluations set: a direct evaluate() logs no eval_reward there at all (0.18 reads model.training).
direct_evaluate_logs_eval_metrics = pytest.mark.skipif(
    TRL is not None and Version("0.16.0") <= TRL < Version("0.18.0"),
    reason=f"TRL {TRL}: a direct evaluate() logs no eval_ metrics (mode from control.should_evaluate)",
)
needs_bug = pytest.mark.skipif(not BUGGY or not HAVE_TORCH, reason=f"TRL {TRL} is outside 0.15.0 - 1.4.x")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _trainer(tmp_path, steps=2):
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    args, _ = grpo_run.make_config(
        os.path.join(tmp_path, "out"),
        steps=steps,
        eval_strategy="steps",
        eval_steps=1,
        save_strategy="steps",
        save_steps=1,
        metric_for_best_model="reward",
        load_best_model_at_end=True,
    )
    return GRPOTrainer(
        model=tiny.save_tiny(os.path.join(tmp_path, "tiny-qwen2"), "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        eval_dataset=tiny.prompt_dataset(4),
        processing_class=tiny.make_tokenizer(),
    )


def _evaluations(trainer):
    return [entry for entry in trainer.state.log_history if "eval_reward" in entry]


@needs_bug
@direct_evaluate_logs_eval_metrics
def test_bug_without_the_patch_train_stops_at_the_first_evaluation(tmp_path, unpatched):
    with unpatched(PID):
        trainer = _trainer(tmp_path)
        returned = trainer.evaluate()
        assert "eval_loss" in returned and "eval_reward" not in returned
        assert "eval_reward" in trainer.state.log_history[-1]  # logged, not returned
        with pytest.raises(KeyError, match="eval_reward"):
            trainer.train()
    assert trainer.state.best_metric is None


@needs_eval
@direct_evaluate_logs_eval_metrics
def test_evaluate_returns_what_it_logged(tmp_path):
    trainer = _trainer(tmp_path)
    returned = trainer.evaluate()
    logged = trainer.state.log_history[-1]
    assert {key: value for key, value in logged.items() if key != "step"} == returned
    assert returned["eval_reward"] == logged["eval_reward"]
    assert isinstance(returned["eval_reward"], float) and returned["eval_reward"] > 0


@needs_eval
def test_best_checkpoint_by_eval_reward(tmp_path):
    trainer = _trainer(tmp_path)
    trainer.train()
    evaluations = _evaluations(trainer)
    assert [entry["step"] for entry in evaluations] == [1, 2]
    rewards = [entry["eval_reward"] for entry in evaluations]
    assert rewards[0] != rewards[1]  # the choice is not a tie
    best = max(evaluations, key=lambda entry: entry["eval_reward"])
    assert trainer.state.best_metric == best["eval_reward"] == max(rewards)
    assert os.path.basename(trainer.state.best_model_checkpoint) == f"checkpoint-{best['step']}"


@pytest.mark.skipif(TRL is None or not HAVE_TORCH, reason="needs TRL")
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = patch.probe(module)
    assert verdict.needed is BUGGY, verdict


class _Buggy:
    def log(self, logs, start_time=None):
        metrics = {"reward": 1.0}
        if next(iter(logs.keys())).startswith("eval_"):
            metrics = {f"eval_{key}": val for key, val in metrics.items()}
        logs = {**logs, **metrics}
        return logs


class _Fixed:
    def log(self, logs, start_time=None):
        metrics = {"reward": 1.0}
        if next(iter(logs.keys())).startswith("eval_"):
            metrics = {f"eval_{key}": val for key, val in metrics.items()}
        logs.update(metrics)


class _Before:  # TRL 0.14.0: no eval_ prefix, no evaluation of its own
    def log(self, logs, start_time=None):
        metrics = {"reward": 1.0}
        logs = {**logs, **metrics}
        return logs


class _Other:
    def log(self, logs, start_time=None):
        logs = dict(logs, **self.metrics)


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_Before, False), (_Other, None)])
def test_probe_on_code_written_here(cls, needed):
    import types

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
