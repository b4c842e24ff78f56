"""scale-rewards-swapped: TRL 0.22.0/0.22.1 swapped the scale_rewards branches.

* Real tiny GRPO runs (TRL 0.22 cells) with a reward function that returns a known vector per
  generation batch; the advantages TRL hands to the loss (``advantages`` in the dict
  ``_generate_and_score_completions`` returns) are compared with ``r - group mean`` and
  ``(r - group mean) / (group std + 1e-4)`` computed here.
* Without the patch on 0.22.1: the default ``"group"`` gives unscaled advantages and ``"none"``
  group-scaled ones. With it (and on 0.22.2, where the patch is "not needed"): each value gives
  what its name says, ``True``/``False`` too, and the logged ``reward_std`` is the group std for
  ``"group"``. ``"batch"`` on 0.22.1 keeps TRL's group scaling and warns; 0.22.2 batch-scales.
* The probe on the cell's TRL and on code written here.
"""

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import scale_rewards_swapped as srs

from packaging.version import Version

from versions import installed

PID = "scale-rewards-swapped"
TRL = installed("trl")
EPS = 1e-4
# four completions per generation batch: two prompts x two generations, groups are consecutive pairs
REWARDS = [1.0, 0.0, 3.0, 0.5]

runs_here = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("0.23.0")),
    reason=f"TRL {TRL}: the scale_rewards labels exist as 0.22 has them only in the 0.22 cells",
)
needs_bug = pytest.mark.skipif(TRL is None or not (Version("0.22.0") <= TRL < Version("0.22.2")), reason=f"TRL {TRL} is fixed")
fixed_release = pytest.mark.skipif(TRL != Version("0.22.2"), reason="the first fixed release")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def fixed_reward(prompts, completions, **kwargs):
    assert len(completions) == len(REWARDS)
    return list(REWARDS)


def expected(kind):
    r = torch.tensor(REWARDS)
    groups = r.view(-1, 2)
    centred = r - groups.mean(dim=1).repeat_interleave(2)
    if kind == "unscaled":
        return centred
    if kind == "group":
        return centred / (groups.std(dim=1).repeat_interleave(2) + EPS)
    assert kind == "batch"
    return centred / (r.std() + EPS)


def _run(tmp_path, scale_rewards):
    """One training step; the advantages of each generation batch and the trainer."""
    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, model="qwen2", steps=1, reward_funcs=[fixed_reward], scale_rewards=scale_rewards)
    seen = []
    method = trainer._generate_and_score_completions

    def spy(*args, **kwargs):
        out = method(*args, **kwargs)
        seen.append(out["advantages"].detach().clone())
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert seen, "TRL computed no advantages"
    return seen, trainer


def assert_advantages(seen, kind):
    for advantages in seen:
        torch.testing.assert_close(advantages, expected(kind), rtol=1e-5, atol=1e-6)


def test_the_expected_values_differ():
    # the three kinds are told apart by these rewards
    assert not torch.allclose(expected("unscaled"), expected("group"))
    assert not torch.allclose(expected("group"), expected("batch"))


@needs_bug
@pytest.mark.parametrize("value, wrong", [("group", "unscaled"), (True, "unscaled"), ("none", "group"), (False, "group")])
def test_bug_without_the_patch_labels_are_swapped(tmp_path, unpatched, value, wrong):
    with unpatched(PID):
        seen, _ = _run(tmp_path, value)
    assert_advantages(seen, wrong)


@runs_here
@pytest.mark.parametrize("value, kind", [("group", "group"), (True, "group"), ("none", "unscaled"), (False, "unscaled")])
def test_each_value_does_what_its_name_says(tmp_path, value, kind):
    seen, trainer = _run(tmp_path, value)
    assert_advantages(seen, kind)
    if kind == "group":
        r = torch.tensor(REWARDS).view(-1, 2)
        logged = [e["reward_std"] for e in trainer.state.log_history if "reward_std" in e]
        assert logged and logged[0] == pytest.approx(r.std(dim=1).mean().item(), rel=1e-5)


@needs_bug
def test_batch_is_not_corrected_and_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger=srs.__name__):
        seen, trainer = _run(tmp_path, "batch")
    assert_advantages(seen, "group")  # TRL 0.22.1's own behaviour for "batch", left as it is
    assert trainer.scale_rewards == "batch"
    assert any("scale_rewards='batch' cannot be corrected" in r.getMessage() and "0.22.2" in r.getMessage() for r in caplog.records)


@fixed_release
def test_fixed_release_batch_scales_by_the_batch_std(tmp_path):
    seen, _ = _run(tmp_path, "batch")
    assert_advantages(seen, "batch")


@runs_here
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = srs.probe(module)
    if TRL < Version("0.22.2"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


class _Swapped:
    def __init__(self, args):
        self.scale_rewards = {True: "group", False: "none"}.get(args.scale_rewards, args.scale_rewards)

    def _generate_and_score_completions(self, rewards):
        if self.scale_rewards in ["batch", "none"]:
            std = rewards.view(-1, 2).std(dim=1)
        elif self.scale_rewards == "group":
            std = rewards.std()
        return std


class _Fixed(_Swapped):
    def _generate_and_score_completions(self, rewards):
        if self.scale_rewards in ["group", "none"]:
            std = rewards.view(-1, 2).std(dim=1)
        return std


class _Boolean(_Swapped):
    def _generate_and_score_completions(self, rewards):
        if self.scale_rewards:
            return rewards.std()


class _NoAttribute(_Swapped):
    def __init__(self, args):
        pass


def _module(cls):
    return type("M", (), {"GRPOTrainer": cls})


@pytest.mark.parametrize(
    "cls, needed",
    [(_Swapped, True), (_Fixed, False), (_Boolean, False), (_NoAttribute, None)],
)
def test_probe_on_written_code(cls, needed):
    assert srs.probe(_module(cls)).needed is needed
