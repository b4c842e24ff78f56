"""none-reward-warning-state: TRL 0.20 - 0.21's warning for a row every reward function declined
indexed the trainer's state (PR #3936 fixed it in 0.22.0).

* Every cell with TRL: the probe on the real TRL code ("needed" exactly on 0.20.x - 0.21.x).
* Stack-free parts on written code: the probe's verdicts; the wrapper makes the state answer an
  index (with a one-line name) during the call only, puts the class back when the call raises, leaves a state
  whose class cannot change as it is (with a warning).
* Affected cells: one real tiny GRPO step whose reward function declines the first completion of
  four. Without the patch it raises TRL's ``TypeError``; with it the step trains, TRL's warning
  is written, the rewards TRL returns are NaN for the declined row and 2, 0, 1 for the others,
  the reward function got the trainer's own state object, and the state's class is TRL's again.
"""

import math
import warnings

from trl_compat.patches import none_reward_warning_state as patch_module

import pytest
from packaging.version import Version

import written_code
from versions import installed

PATCH_ID = "none-reward-warning-state"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("0.20.0") <= TRL < Version("0.22.0")
SCORES = [None, 2.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "source, verdict",
    [
        (  # 0.20.0 - 0.21.x
            'reward_kwargs["trainer_state"] = self.state\n'
            "        row_reward_kwargs = {key: value[nan_row_idx] for key, value in reward_kwargs.items()}",
            True,
        ),
        (  # 0.22.0 on
            'reward_kwargs["trainer_state"] = self.state\n'
            "        row_reward_kwargs = {\n"
            '            key: value[nan_row_idx] for key, value in reward_kwargs.items() if key != "trainer_state"\n'
            "        }",
            False,
        ),
        (  # 1.0.0 on
            'reward_kwargs["trainer_state"] = self.state\n'
            "        row_reward_kwargs = {\n"
            "            key: value[nan_row_idx]\n"
            "            for key, value in reward_kwargs.items()\n"
            '            if key not in ("trainer_state", "log_extra", "log_metric")\n'
            "        }",
            False,
        ),
        (  # 0.19.x: no trainer_state among the kwargs
            "row_reward_kwargs = {key: value[nan_row_idx] for key, value in reward_kwargs.items()}",
            False,
        ),
        ('reward_kwargs["trainer_state"] = self.state\n        row = dict(reward_kwargs)', None),
    ],
)
def test_probe_on_written_code(tmp_path, monkeypatch, source, verdict):

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        "class GRPOTrainer:\n"
        "    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):\n"
        "        reward_kwargs = {}\n"
        f"        {source}\n"
    )
    module = written_code.load(path, monkeypatch)
    assert patch_module.probe(module).needed is verdict


class State:
    def __init__(self):
        self.global_step = 3


class Trainer:
    def __init__(self, state):
        self.state = state


def _indexes_state(self, fail=False):
    """A stand-in for TRL 0.20's code: indexes the state as its warning does."""
    seen = (type(self.state), self.state[0])
    if fail:
        raise RuntimeError("a reward function failed")
    return seen


def test_the_state_is_indexable_during_the_call_only():
    state = State()
    trainer = Trainer(state)
    with pytest.raises(TypeError, match="not subscriptable"):
        _indexes_state(trainer)
    seen_type, indexed = patch_module._wrap(_indexes_state)(trainer)
    assert indexed == "<State at global_step 3>" and issubclass(seen_type, State) and seen_type is not State
    assert seen_type.__name__ == "State"  # what TRL's warning prints
    assert type(state) is State and trainer.state is state and state.global_step == 3
    with pytest.raises(RuntimeError, match="a reward function failed"):
        patch_module._wrap(_indexes_state)(trainer, fail=True)
    assert type(state) is State


def test_a_state_whose_class_cannot_change_is_left_alone(caplog):
    class Slotted:
        __slots__ = ("global_step",)

    class OtherSlots:
        __slots__ = ("other",)

    state = Slotted()
    assert not patch_module._swap_class(state, OtherSlots)
    assert patch_module._swap_class(State(), patch_module.indexable(State))
    # a class the subclass cannot take the place of (layouts differ): TRL's own error, and a warning
    trainer = Trainer(1.5)
    with pytest.raises(TypeError, match="not subscriptable"):
        patch_module._wrap(_indexes_state)(trainer)
    assert "takes no other class" in caplog.text


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    verdict = patch_module.probe(grpo)
    assert verdict.needed is AFFECTED, verdict


# -- real GRPO runs ----------------------------------------------------------------------------

needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"TRL 0.20.x - 0.21.x only (here trl {TRL})")


def _step(tmp_path):
    """One training step with a reward function that declines the first completion: the rewards
    ``_calculate_rewards`` returned, the warnings, and what the reward function got as trainer_state."""
    pytest.importorskip("torch")
    import grpo_run

    got_states = []

    def declines_the_first(completions, trainer_state=None, **kwargs):
        got_states.append(trainer_state)
        return SCORES[: len(completions)]

    trainer = grpo_run.make_trainer(
        tmp_path,
        steps=1,
        reward_funcs=[declines_the_first],
        num_generations=4,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
    )
    rewards = []
    method = trainer._calculate_rewards

    def spy(*args, **kwargs):
        rewards.append(method(*args, **kwargs).detach().clone())
        return rewards[-1]

    trainer._calculate_rewards = spy
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.train()
    return trainer, rewards, [str(w.message) for w in caught], got_states


@needs_affected
def test_bug_without_the_patch_the_warning_crashes(tmp_path, unpatched):
    with unpatched(PATCH_ID):
        with pytest.raises(TypeError, match="'TrainerState' object is not subscriptable"):
            _step(tmp_path)


@needs_affected
def test_with_the_patch_the_step_trains_and_warns(tmp_path):
    from transformers import TrainerState

    trainer, rewards, messages, got_states = _step(tmp_path)
    assert len(rewards) == 1 and rewards[0].shape == (4, 1)
    values = rewards[0][:, 0].tolist()
    assert math.isnan(values[0]) and values[1:] == [2.0, 0.0, 1.0]
    warned = [m for m in messages if "All reward functions returned None" in m]
    assert warned and "'trainer_state': '<TrainerState at global_step 0>'" in warned[0], messages
    assert got_states and all(s is trainer.state for s in got_states)
    assert type(trainer.state) is TrainerState and trainer.state.global_step == 1
