"""num-generations-eval-check: TRL 0.26.0 checked the eval batch against num_generations, not num_generations_eval.

* Unpatched on 0.26.0: the valid ``num_generations=4, num_generations_eval=2,
  per_device_eval_batch_size=2`` is refused (``... must be divisible by num_generations (4).``),
  and the invalid ``num_generations=2, num_generations_eval=4, per_device_eval_batch_size=2``
  builds a trainer whose ``evaluate()`` raises ``shape '[-1, 4]' is invalid for input of size 2``.
* Patched: the valid config trains one step and evaluates in a real run, the reward function seeing
  each eval prompt exactly twice per call (groups of 2) and each train prompt 4 times; the invalid one
  is refused when the config is built, with 0.26.1's message; a config without
  ``num_generations_eval`` meets TRL's own check and message.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import dataclasses
import types
from collections import Counter

import pytest
from packaging.version import Version

from versions import installed

PID = "num-generations-eval-check"
TRL = installed("trl")

needs_bug = pytest.mark.skipif(
    TRL is None or TRL != Version("0.26.0"), reason=f"TRL {TRL}: the check against num_generations is 0.26.0's"
)
VALID = dict(num_generations=4, num_generations_eval=2, per_device_train_batch_size=4, per_device_eval_batch_size=2)
INVALID = dict(num_generations=2, num_generations_eval=4, per_device_train_batch_size=2, per_device_eval_batch_size=2)
EVAL = dict(eval_strategy="steps", eval_steps=1)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_config  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _config(tmp_path, **settings):
    import grpo_run

    return grpo_run.make_config(tmp_path, steps=1, **EVAL, **settings)[0]


def _trainer(tmp_path, reward, **settings):
    import grpo_run
    import tiny

    return grpo_run.make_trainer(tmp_path, steps=1, reward_funcs=[reward], eval_dataset=tiny.prompt_dataset(2), **EVAL, **settings)


class _GroupRecorder:
    """A reward function that notes, per call, how many times each prompt came (train and eval)."""

    __name__ = "group_recorder"

    def __init__(self):
        self.calls = []

    def __call__(self, prompts, completions, **kwargs):
        import tiny

        self.calls.append(sorted(Counter(prompts).values()))
        return tiny.varying_reward(prompts, completions)


@needs_bug
def test_bug_without_the_patch_a_valid_config_is_refused(tmp_path, unpatched):
    refused = r"global eval batch size \(2 \* 1\) must be divisible by num_generations \(4\)"
    with unpatched(PID), pytest.raises(ValueError, match=refused):
        _config(tmp_path, **VALID)


@needs_bug
def test_bug_without_the_patch_an_invalid_config_crashes_at_evaluation(tmp_path, unpatched):
    with unpatched(PID):
        trainer = _trainer(tmp_path, _GroupRecorder(), **INVALID)
        assert trainer.num_generations_eval == 4 and trainer.args.per_device_eval_batch_size == 2
        with pytest.raises(RuntimeError, match=r"shape '\[-1, 4\]' is invalid for input of size 2"):
            trainer.evaluate()


@needs_bug
def test_the_valid_config_trains_and_evaluates_in_groups_of_num_generations_eval(tmp_path):
    reward = _GroupRecorder()
    trainer = _trainer(tmp_path, reward, **VALID)
    assert trainer.args.per_device_eval_batch_size == 2 and trainer.num_generations_eval == 2
    trainer.train()  # eval_steps=1: one train step, then the evaluation of 2 prompts
    assert trainer.state.global_step == 1
    # train: one prompt, 4 completions; eval: 2 prompts, one batch of 2 each time, both completions of one prompt
    assert reward.calls == [[4], [2], [2]]
    evaluated = [entry for entry in trainer.state.log_history if "eval_loss" in entry or "eval_reward" in entry]
    assert len(evaluated) == 1


@needs_bug
def test_the_invalid_config_is_refused_when_built(tmp_path):
    with pytest.raises(ValueError) as caught:
        _config(tmp_path, **INVALID)
    assert str(caught.value) == (
        "The global eval batch size (2 * 1) must be divisible by the number of generations used for evaluation (4)."
    )


@needs_bug
def test_a_config_without_num_generations_eval_meets_trls_own_check(tmp_path):
    with pytest.raises(ValueError) as caught:
        _config(tmp_path, num_generations=2, per_device_eval_batch_size=3)
    assert str(caught.value) == "The global eval batch size (3 * 1) must be divisible by num_generations (2)."
    config = _config(tmp_path, num_generations=2, num_generations_eval=2, per_device_eval_batch_size=4)
    assert (config.per_device_eval_batch_size, config.num_generations_eval) == (4, 2)


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import num_generations_eval_check as patch

    import trl.trainer.grpo_config as module

    assert patch.probe(module).needed is (TRL == Version("0.26.0"))


@dataclasses.dataclass
class _Buggy:
    num_generations_eval: int | None = None

    def __post_init__(self):
        num_processes = 1
        if (self.per_device_eval_batch_size * num_processes) % self.num_generations != 0:
            raise ValueError


@dataclasses.dataclass
class _Fixed:
    num_generations_eval: int | None = None

    def __post_init__(self):
        num_processes, num_generations = 1, self.num_generations_eval or self.num_generations
        if (self.per_device_eval_batch_size * num_processes) % num_generations != 0:
            raise ValueError


@dataclasses.dataclass
class _NoSetting:
    def __post_init__(self):
        num_processes = 1
        if (self.per_device_eval_batch_size * num_processes) % self.num_generations != 0:
            raise ValueError


@dataclasses.dataclass
class _Unknown:
    num_generations_eval: int | None = None

    def __post_init__(self):
        pass


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_NoSetting, False), (_Unknown, None)])
def test_probe_on_code_written_here(cls, needed):
    from trl_compat.patches import num_generations_eval_check as patch

    assert patch.probe(types.SimpleNamespace(GRPOConfig=cls)).needed is needed
