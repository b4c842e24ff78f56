"""none-reward-baseline: a completion every reward function declined entered its group's baseline (TRL 0.16 - 1.5).

* Real tiny GRPO runs: one step, one group of 4 completions (``num_generations=4``), one reward
  function that declines the first completion (``None``) and scores the others 2, 0 and 1.
* Hand-computed advantages (``scale_rewards`` at its default, the group's std; TRL's 1e-4):
  without the patch the declined row counts as reward 0: mean 0.75, std sqrt(2.75 / 3), so the
  declined completion gets -0.75 / (0.9574 + 1e-4) = -0.7833; with it (and from 1.6.0) the baseline
  is that of 2, 0, 1: mean 1, std 1, advantages [0, 1, -1, 0] / (1 + 1e-4), the declined one 0.
* A batch where every completion has a reward is left as TRL computed it, bit for bit.
* ``baseline_free_advantages`` on hand-computed batches: ``scale_rewards="batch"``, ``"none"`` and
  ``normalize_then_sum``; every row declined; the probe on the cell's TRL and on code written here.
* On TRL 0.20 - 0.21 these runs need ``none-reward-warning-state`` too (TRL's warning for the
  declined row crashes without it); its own tests show that crash.
"""

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import none_reward_baseline as nrb

from packaging.version import Version

from versions import installed

PID = "none-reward-baseline"
TRL = installed("trl")
SCORES = [None, 2.0, 0.0, 1.0]
BUGGY_STD = math.sqrt(((0 - 0.75) ** 2 + (2 - 0.75) ** 2 + (0 - 0.75) ** 2 + (1 - 0.75) ** 2) / 3)
BUGGY = [(r - 0.75) / (BUGGY_STD + 1e-4) for r in (0.0, 2.0, 0.0, 1.0)]
FIXED = [0.0, 1 / (1 + 1e-4), -1 / (1 + 1e-4), 0.0]

needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.19.0"), reason=f"TRL {TRL}: before _calculate_rewards (0.19.0)")
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.19.0") <= TRL < Version("1.6.0")), reason=f"TRL {TRL} is outside 0.19.0 - 1.5.x"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def declines_the_first(completions, **kwargs):
    return SCORES[: len(completions)]


def scores_all(completions, **kwargs):
    return [2.0, 0.5, 0.0, 1.0][: len(completions)]


def _advantages(tmp_path, reward=declines_the_first):
    """One training step; the advantages ``_generate_and_score_completions`` returned, in generation order."""
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path, steps=1, reward_funcs=[reward], num_generations=4, gradient_accumulation_steps=1, steps_per_generation=1
    )
    seen = []
    method = trainer._generate_and_score_completions

    def spy(*args, **kwargs):
        output = method(*args, **kwargs)
        seen.append(output["advantages"].detach().clone())
        return output

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert len(seen) == 1 and seen[0].shape == (4,), seen
    return seen[0].tolist()


def test_the_hand_computed_advantages_differ():
    assert BUGGY[0] == pytest.approx(-0.7833, abs=1e-4)
    assert FIXED[0] == 0.0 and BUGGY[0] != 0.0


@needs_bug
def test_bug_without_the_patch_the_declined_completion_is_in_the_baseline(tmp_path, unpatched):
    with unpatched(PID):
        advantages = _advantages(tmp_path)
    assert advantages == pytest.approx(BUGGY, abs=1e-5)


@needs_trl
def test_the_declined_completion_is_left_out_and_gets_advantage_zero(tmp_path):
    assert _advantages(tmp_path) == pytest.approx(FIXED, abs=1e-5)


@needs_bug
def test_a_batch_every_function_scored_is_left_as_trl_made_it(tmp_path, unpatched):
    with unpatched(PID):
        trl_made = _advantages(tmp_path / "unpatched", reward=scores_all)
    assert _advantages(tmp_path / "patched", reward=scores_all) == trl_made


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = nrb.probe(module)
    if TRL < Version("1.6.0"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


# -- baseline_free_advantages on hand-computed batches ----------------------------------------------------

NAN = float("nan")


def _free(rows, scale="group", aggregation="sum_then_normalize", generations=2, weights=None):
    rewards = torch.tensor(rows, dtype=torch.float32)
    weights = torch.ones(rewards.shape[1]) if weights is None else torch.tensor(weights)
    return nrb.baseline_free_advantages(rewards, weights, generations, scale, aggregation).tolist()


def test_group_scale_two_groups():
    # group 1: [declined, 3] -> one scored row: its std is NaN (TRL 1.6's nanstd), advantage 0; group 2: [1, 3]
    std = math.sqrt(2)
    assert _free([[NAN], [3.0], [1.0], [3.0]]) == pytest.approx([0.0, 0.0, -1 / (std + 1e-4), 1 / (std + 1e-4)], abs=1e-6)


def test_no_scale_centres_on_the_scored_rows():
    assert _free([[NAN], [3.0], [1.0], [3.0], [5.0], [NAN]], scale="none", generations=3) == pytest.approx(
        [0.0, 1.0, -1.0, -1.0, 1.0, 0.0], abs=1e-6
    )


def test_batch_scale_uses_the_scored_rows_of_the_batch():
    # rewards 3, 1, 3 scored: batch std sqrt(((3-7/3)^2 * 2 + (1-7/3)^2) / 2); group means 3 and 2
    std = math.sqrt(((3 - 7 / 3) ** 2 * 2 + (1 - 7 / 3) ** 2) / 2)
    assert _free([[NAN], [3.0], [1.0], [3.0]], scale="batch") == pytest.approx(
        [0.0, 0.0, -1 / (std + 1e-4), 1 / (std + 1e-4)], abs=1e-6
    )


def test_a_row_one_function_scored_keeps_its_reward():
    # two functions: row 0 scored by the second only (reward 4), row 1 by both (1 + 1): not declined
    assert _free([[NAN, 4.0], [1.0, 1.0]], scale="none") == pytest.approx([1.0, -1.0], abs=1e-6)


def test_normalize_then_sum():
    # per function and group: [declined, 2, 4, 6] -> mean 4, std 2 -> [NaN, -1, 0, 1] (/ (2 + 1e-4)); the
    # declined row is left out of the batch step: rewards -k, 0, k -> mean 0, std k
    k = 2 / (2 + 1e-4)
    out = _free([[NAN], [2.0], [4.0], [6.0]], aggregation="normalize_then_sum", generations=4)
    assert out == pytest.approx([0.0, -k / (k + 1e-4), 0.0, k / (k + 1e-4)], abs=1e-6)


def test_every_row_declined_gives_zero_advantages():
    assert _free([[NAN], [NAN], [NAN], [NAN]]) == [0.0, 0.0, 0.0, 0.0]


def test_nanstd_is_trls_without_nans():
    values = torch.tensor([[1.0, 2.0, 4.0], [3.0, 3.0, 7.0]])
    assert nrb.nanstd(values, dim=1).tolist() == pytest.approx(values.std(dim=1).tolist(), abs=1e-6)
    assert float(nrb.nanstd(values)) == pytest.approx(float(values.std()), abs=1e-6)


@pytest.mark.parametrize(
    "setting,form,mode",
    [(True, "bool", "group"), (False, "bool", "none"), ("group", "swapped", "none"), ("none", "swapped", "group")]
    + [("batch", "swapped", "group"), ("batch", "named", "batch"), ("group", "named", "group")],
)
def test_scale_mode_reads_the_setting_as_the_release_does(setting, form, mode):
    class Trainer:
        scale_rewards = setting

    assert nrb.scale_mode(Trainer(), form) == mode


# -- the probe on code written here: the shapes of TRL 0.19 - 0.21, 0.22.2 - 1.5 and 1.6 -----------------


class _Bool019:
    def _calculate_rewards(self):
        pass

    def _generate_and_score_completions(self, device):
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # noqa: F821
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        mean_grouped_rewards = rewards.view(-1, self.num_generations).mean(dim=1)
        advantages = rewards - mean_grouped_rewards
        if self.scale_rewards:
            advantages = advantages / 2
        return {"advantages": advantages}


class _Named15(_Bool019):
    def _generate_and_score_completions(self, device, num_generations):
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # noqa: F821
        rewards = (rewards_per_func * self.reward_weights.to(device).unsqueeze(0)).nansum(dim=1)
        mean_grouped_rewards = rewards.view(-1, num_generations).mean(dim=1)
        if self.scale_rewards in ["group", "none"]:
            pass
        return {"advantages": rewards - mean_grouped_rewards}


class _Fixed16(_Bool019):
    def _generate_and_score_completions(self, device, num_generations):
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # noqa: F821
        unscorable_mask = torch.isnan(rewards_per_func).all(dim=1)
        return {"advantages": unscorable_mask}


class _Unknown(_Bool019):
    def _generate_and_score_completions(self, device):
        rewards_per_func = self._calculate_rewards(inputs, prompts, completions, completion_ids_list)  # noqa: F821
        return {"advantages": rewards_per_func.sum(dim=1)}


class _Inline018:
    def _generate_and_score_completions(self):
        pass


@pytest.mark.parametrize(
    "cls,needed,form",
    [(_Bool019, True, "bool"), (_Named15, True, "named"), (_Fixed16, False, None), (_Unknown, None, None), (_Inline018, None, None)],
)
def test_probe_on_code_written_here(cls, needed, form):
    import types

    verdict = nrb.probe(types.SimpleNamespace(GRPOTrainer=cls))
    assert verdict.needed is needed, verdict
    if needed:
        assert nrb.scale_form(__import__("inspect").getsource(cls._generate_and_score_completions)) == form
