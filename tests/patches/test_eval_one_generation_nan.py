"""eval-one-generation-nan: evaluating with ``num_generations_eval=1`` gave NaN advantages, eval loss
and reward std (TRL 0.26.x; PR #4662 fixed it in 0.27.0).

* Every cell with TRL: the probe on the real TRL code ("needed" exactly on 0.26.x).
* Stack-free parts on written code: the probe's verdicts; the logged values a batch of one-completion
  groups leaves are set to 0.27.0's (only this batch's, only NaN ones).
* Affected cells: ``trainer.evaluate()`` on a tiny model, 4 eval prompts, one completion each
  (``num_generations_eval=1``), ``beta=0``: without the patch ``eval_loss`` and
  ``eval_reward_std`` are NaN and every advantage is NaN; with it every advantage is 0, so the GRPO
  loss is 0 exactly, ``eval_reward_std`` is 0 and ``eval_frac_reward_zero_std`` 1, as TRL 0.27.0
  gives them. A training step with ``num_generations=2`` next to it is TRL's own, bit for bit.
"""

import collections
import math

from trl_compat.patches import eval_one_generation_nan as patch_module

import pytest
from packaging.version import Version

import written_code
from versions import installed

PATCH_ID = "eval-one-generation-nan"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("0.26.0") <= TRL < Version("0.27.0")
NAN = float("nan")


@pytest.mark.parametrize(
    "source, verdict",
    [
        (  # 0.26.x
            "num_generations = self.num_generations if mode == 'train' else self.num_generations_eval\n"
            "        std_rewards = rewards.view(-1, num_generations).std(dim=1)",
            True,
        ),
        (  # 0.27.0 on
            "num_generations = self.num_generations if mode == 'train' else self.num_generations_eval\n"
            "        if num_generations > 1:\n"
            "            std_rewards = rewards.view(-1, num_generations).std(dim=1)",
            False,
        ),
        ("std_rewards = rewards.view(-1, self.num_generations).std(dim=1)", False),  # TRL < 0.26
        ("num_generations = self.num_generations_eval\n        std_rewards = nanstd(rewards)", None),
    ],
)
def test_probe_on_written_code(tmp_path, monkeypatch, source, verdict):

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        f"class GRPOTrainer:\n    def _generate_and_score_completions(self, inputs):\n        mode = 'train'\n        {source}\n"
    )
    module = written_code.load(path, monkeypatch)
    assert patch_module.probe(module).needed is verdict


def test_only_this_batch_nan_logs_are_set():
    class Trainer:
        _metrics = {"eval": {"reward_std": [0.5, NAN], "frac_reward_zero_std": [0.0, 0.0]}}
        _logs = {"advantages": collections.deque([NAN, 1.0, NAN, NAN], maxlen=10)}

    trainer = Trainer()
    patch_module._fix_logs(trainer, count=2)
    assert trainer._metrics["eval"] == {"reward_std": [0.5, 0.0], "frac_reward_zero_std": [0.0, 1.0]}
    got = list(trainer._logs["advantages"])
    assert math.isnan(got[0]) and got[1:] == [1.0, 0.0, 0.0]  # an earlier batch's entry is not this patch's
    spread = {"eval": {"reward_std": [0.7], "frac_reward_zero_std": [0.25]}}
    trainer._metrics = spread  # a batch whose std is a number: left as TRL logged it
    patch_module._fix_logs(trainer, count=2)
    assert spread == {"eval": {"reward_std": [0.7], "frac_reward_zero_std": [0.25]}}


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    verdict = patch_module.probe(grpo)
    assert verdict.needed is AFFECTED, verdict


# -- real GRPO runs ----------------------------------------------------------------------------

needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"TRL 0.26.x only (here trl {TRL})")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _trainer(tmp_path):
    pytest.importorskip("torch")
    import grpo_run
    import tiny

    return grpo_run.make_trainer(
        tmp_path,
        steps=1,
        eval_dataset=tiny.prompt_dataset(4),
        num_generations=2,
        num_generations_eval=1,
        per_device_eval_batch_size=4,
        beta=0.0,
        loss_type="grpo",
    )


def _evaluate(trainer):
    """``evaluate()``'s metrics and the advantages of the batch it scored."""
    import grpo_run

    batches = grpo_run.spy_scored_batches(trainer)
    metrics = trainer.evaluate()
    assert len(batches) == 1 and batches[0]["advantages"].shape == (4,), batches
    return metrics, batches[0]["advantages"].tolist()


@needs_affected
def test_bug_without_the_patch_eval_is_nan(tmp_path, unpatched):
    trainer = _trainer(tmp_path)
    with unpatched(PATCH_ID):
        metrics, advantages = _evaluate(trainer)
    assert all(math.isnan(a) for a in advantages)
    assert math.isnan(metrics["eval_loss"]) and math.isnan(metrics["eval_reward_std"])


@needs_affected
def test_with_the_patch_eval_gives_0_27_values(tmp_path):
    trainer = _trainer(tmp_path)
    metrics, advantages = _evaluate(trainer)
    assert advantages == [0.0, 0.0, 0.0, 0.0]
    assert metrics["eval_loss"] == 0.0
    assert metrics["eval_reward_std"] == 0.0 and metrics["eval_frac_reward_zero_std"] == 1.0


@needs_affected
def test_a_training_step_is_trl_s_own(tmp_path, unpatched):
    import grpo_run

    runs = {}
    for name, context in (("patched", None), ("unpatched", unpatched(PATCH_ID))):
        trainer = _trainer(tmp_path / name)
        seen = grpo_run.spy_scored_batches(trainer)
        if context is None:
            trainer.train()
        else:
            with context:
                trainer.train()
        runs[name] = [batch["advantages"].tolist() for batch in seen]
    assert runs["patched"] and runs["patched"] == runs["unpatched"]
