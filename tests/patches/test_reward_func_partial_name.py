"""reward-func-partial-name: a ``functools.partial`` and a callable instance as reward functions
(TRL 0.14.0 - 1.8.x; PR #6313 fixed it in 1.9.0).

* Every cell with TRL: the probe on the real TRL code ("needed" exactly below 1.9.0).
* Stack-free parts on written code: the probe's three verdicts and the names given (TRL 1.9's
  ``get_callable_name``: nested partials unwrapped, an instance by its class).
* Affected cells: without the patch ``GRPOTrainer(...)`` (0.17+; the first step on 0.14 - 0.16)
  raises ``AttributeError`` naming ``__name__``; with it a real tiny GRPO run trains with both
  reward functions, each called with its own settings, logged under TRL 1.9's names with the
  rewards it returned.
"""

import functools

import trl_compat
from trl_compat.patches import reward_func_partial_name as patch_module

import pytest
from packaging.version import Version

import written_code
from versions import installed

PATCH_ID = "reward-func-partial-name"
TRL = installed("trl")
AFFECTED = TRL is not None and TRL < Version("1.9.0")


def scaled_length(completions, scale, **kwargs):
    """A reward function with a setting: ``scale`` x the completion's length in characters."""
    return [scale * len(str(c)) for c in completions]


class CountA:
    """A callable instance: the number of ``a`` letters, plus ``offset``."""

    def __init__(self, offset):
        self.offset = offset
        self.calls = 0

    def __call__(self, completions, **kwargs):
        self.calls += 1
        return [self.offset + str(c).count("a") for c in completions]


def test_names_given_as_trl_1_9_does():
    nested = functools.partial(functools.partial(scaled_length, scale=2.0))
    instance = CountA(1.0)
    assert patch_module.callable_name(nested) == "scaled_length"
    assert patch_module.callable_name(instance) == "CountA"
    patch_module.name_reward_funcs([nested, instance, scaled_length, "org/reward-model", None])
    assert nested.__name__ == "scaled_length" and instance.__name__ == "CountA"
    assert nested(["ab"]) == [4.0] and instance(["aa"]) == [3.0]  # the objects are kept, and still work
    single = functools.partial(scaled_length, scale=1.0)
    patch_module.name_reward_funcs(single)  # reward_funcs may be one callable
    assert single.__name__ == "scaled_length"


def test_object_without_attributes_is_left_alone(caplog):
    class Slotted:
        __slots__ = ()

        def __call__(self, completions, **kwargs):
            return [0.0] * len(completions)

    reward = Slotted()
    patch_module.name_reward_funcs([reward])
    assert not hasattr(reward, "__name__")
    assert "cannot name the reward function" in caplog.text


@pytest.mark.parametrize(
    "source, verdict",
    [
        ("self.reward_func_names.append(reward_funcs[i].__name__)", True),  # 0.17 - 1.8
        ("reward_func_name = reward_func.__name__", True),  # 0.14 - 0.16, first step
        ("self.reward_func_names.append(get_callable_name(reward_funcs[i]))", False),  # 1.9.0
        ("self.reward_func_names.append(str(reward_funcs[i]))", None),
    ],
)
def test_probe_on_written_code(tmp_path, monkeypatch, source, verdict):

    path = tmp_path / "fake_grpo.py"
    path.write_text(f"class GRPOTrainer:\n    def __init__(self, reward_funcs):\n        {source}\n")
    module = written_code.load(path, monkeypatch)
    assert patch_module.probe(module).needed is verdict


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    verdict = patch_module.probe(grpo)
    assert verdict.needed is AFFECTED, verdict


# -- real GRPO runs ----------------------------------------------------------------------------

needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"TRL < 1.9.0 only (here trl {TRL})")


def reward_funcs():
    return [functools.partial(scaled_length, scale=0.5), CountA(offset=2.0)]


@needs_affected
def test_partial_and_instance_crash_without_patch(tmp_path, unpatched):
    pytest.importorskip("torch")
    import grpo_run

    with unpatched(PATCH_ID):
        with pytest.raises(AttributeError, match="__name__"):
            # TRL 0.17+ fail in GRPOTrainer(...), 0.14 - 0.16 at the first step
            grpo_run.run_grpo(tmp_path, steps=1, reward_funcs=reward_funcs())


@needs_affected
def test_partial_and_instance_train_with_patch(tmp_path):
    pytest.importorskip("torch")
    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    funcs = reward_funcs()
    trainer, history = grpo_run.run_grpo(tmp_path, steps=2, reward_funcs=funcs)
    assert [f.__name__ for f in funcs] == ["scaled_length", "CountA"]
    if hasattr(trainer, "reward_func_names"):  # TRL >= 0.17
        assert trainer.reward_func_names == ["scaled_length", "CountA"]
    assert funcs[1].calls >= 2  # the instance itself was called, once per generation batch
    logged = [e for e in history if "loss" in e]
    assert len(logged) == 2 and grpo_run.finite_losses(history), history
    for entry in logged:
        # 0.14 logs rewards/<name>, later releases rewards/<name>/mean
        length = entry.get("rewards/scaled_length/mean", entry.get("rewards/scaled_length"))
        count = entry.get("rewards/CountA/mean", entry.get("rewards/CountA"))
        assert length is not None and count is not None, entry
        assert length > 0
        assert count >= 2.0  # offset 2 + a count >= 0
        assert entry["reward"] == pytest.approx(length + count, rel=1e-5)
    assert grpo_run.changed_trainable(trainer), "the policy did not train"
