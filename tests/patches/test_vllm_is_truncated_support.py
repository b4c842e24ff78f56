"""vllm-is-truncated-support: with top_k / top_p truncating vLLM's sampling, TRL's importance-sampling ratio
divides full-vocabulary log-probs by log-probs renormalised over the kept tokens (TRL #6789).

* trl-newest (stand-in vLLM 0.31.0) and trl0.26.0-tf4.57.3 (0.11.2; log-probs from materialised logits, 1.x
  through a fused LM head): a real 1-step GRPO run, ``use_vllm=True``, colocate, learning rate 0 (the policy
  the test reads afterwards is the one that scored the batch), ``vllm_importance_sampling_mode="token_truncate"``.
  The stand-in's processed log-probs are those of the truncated, renormalised distribution, as vLLM >= 0.10.2's.
  Without the patch each token's ratio equals the trainer's kept mass S_t, computed here from the policy's
  logits with the test's own top-k / top-p; with it the ratio is 1 up to the stand-in's float16 noise, TRL's
  batch keeps full-vocabulary ``old_per_token_logps`` and ``sampling_per_token_logps`` is moved onto the full
  vocabulary.
* The kept set against vLLM's own algorithm (min_p, then top_k, then top_p) on random logits.
* The probe on the real TRL of each cell and on code written here.
"""

from __future__ import annotations

import importlib
import math

import trl_compat
from trl_compat.patches import vllm_is_truncated_support as patch_module

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed

PATCH_ID = "vllm-is-truncated-support"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and TRL >= Version("0.26.0") and VLLM is not None and VLLM >= Version("0.10.2")
in_window = pytest.mark.skipif(not IN_WINDOW, reason="TRL >= 0.26 with the vLLM stand-in (trl-newest, trl0.26.0-tf4.57.3)")
# one cell per shape of TRL's code: 0.26 - 0.27 (the trainer builds the engine), 0.28+ (generation/)
shapes = only_in_cells("trl0.26.0-tf4.57.3", "trl1.0.0-tf4.57.6-ds0.19.2", "trl-newest", why="GRPO runs by value")
TRUNCATIONS = [pytest.param({"top_k": 16}, id="top_k"), pytest.param({"top_p": 0.7}, id="top_p")]


def _run(tmp_path, truncation):
    """One real GRPO step on the stand-in; returns (trainer, the batch TRL scored, its logs)."""
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path,
        use_vllm=True,
        steps=1,
        temperature=1.0,
        learning_rate=0.0,
        vllm_importance_sampling_mode="token_truncate",
        **truncation,
    )
    batches = grpo_run.spy_scored_batches(trainer)
    trainer.train()
    logged = next(e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in e)
    return trainer, batches[0], logged


def _reference(trainer, batch, truncation):
    """(log S_t, full-vocabulary log p_t) of the sampled tokens, from the policy's logits, the test's own way."""
    import torch

    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1)
    mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], dim=1)
    keep = batch["completion_ids"].size(1)
    with torch.no_grad():
        logits = trainer.model(input_ids=ids, attention_mask=mask).logits[:, -keep - 1 : -1].float() / trainer.temperature
    probs = logits.softmax(-1)
    descending = probs.sort(dim=-1, descending=True).values
    if "top_k" in truncation:
        kept = descending[..., : truncation["top_k"]].sum(-1)
    else:  # a token is kept while the mass of the tokens above it is below top_p
        above = descending.cumsum(-1) - descending
        kept = (descending * (above < truncation["top_p"])).sum(-1)
    full = probs.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1).log()
    return kept.log(), full


@in_window
@shapes
@pytest.mark.parametrize("truncation", TRUNCATIONS)
def test_ratio_is_the_kept_mass_without_the_patch(tmp_path, unpatched, truncation):
    importlib.import_module("trl.trainer.grpo_trainer")  # the patch's trigger
    with unpatched(PATCH_ID):
        trainer, batch, logged = _run(tmp_path, truncation)
    log_kept, _ = _reference(trainer, batch, truncation)
    valid = batch["completion_mask"].bool()
    log_ratio = batch["importance_sampling_ratio"][valid].log()
    assert log_kept[valid].mean().item() < -0.3, log_kept  # the truncation drops real mass here
    assert (log_ratio - log_kept[valid]).abs().max().item() < 0.05, (log_ratio, log_kept[valid])
    assert logged["sampling/importance_sampling_ratio/mean"] < math.exp(-0.3), logged


@in_window
@shapes
@pytest.mark.parametrize("truncation", TRUNCATIONS)
def test_replayed_truncation_keeps_the_ratio_at_one(tmp_path, truncation):
    importlib.import_module("trl.trainer.grpo_trainer")  # the patch's trigger
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    trainer, batch, logged = _run(tmp_path, truncation)
    log_kept, full = _reference(trainer, batch, truncation)
    valid = batch["completion_mask"].bool()
    log_ratio = batch["importance_sampling_ratio"][valid].log()
    assert log_ratio.abs().max().item() < 0.05 and log_ratio.abs().mean().item() < 0.01, log_ratio
    assert abs(logged["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.01, logged
    assert logged["sampling/sampling_logp_difference/mean"] < 0.01, logged
    # what _compute_loss gets: full-vocabulary old log-probs (its PPO ratio), vLLM's moved onto the full vocabulary
    assert (batch["old_per_token_logps"][valid] - full[valid]).abs().max().item() < 1e-3
    if "sampling_per_token_logps" in batch:  # returned for the off-policy mask from TRL 0.27
        assert (batch["sampling_per_token_logps"][valid] - full[valid]).abs().max().item() < 0.05


def _vllm_reference(logits, top_k, top_p, min_p):
    """vLLM's MinPLogitsProcessor and apply_top_k_top_p (vllm/v1/sample/), as written there."""
    import torch

    logits = logits.clone()
    if min_p > 0:
        probs = logits.softmax(-1)
        logits[probs < min_p * probs.amax(-1, keepdim=True)] = -float("inf")
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if top_k:
        threshold = logits_sort.gather(1, torch.full((logits.size(0), 1), logits.size(1) - top_k))
        logits_sort.masked_fill_(logits_sort < threshold, -float("inf"))
    if top_p < 1:
        probs_sum = logits_sort.softmax(dim=-1).cumsum(dim=-1)
        top_p_mask = probs_sum <= 1 - top_p
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return logits_sort.scatter(dim=-1, index=logits_idx, src=logits_sort) > -float("inf")


@pytest.mark.parametrize("top_k, top_p, min_p", [(20, 1.0, 0.0), (0, 0.8, 0.0), (0, 1.0, 0.05), (50, 0.9, 0.02)])
def test_kept_set_follows_vllm(top_k, top_p, min_p):
    torch = pytest.importorskip("torch")
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 1000, generator=gen) * 3
    truncation = patch_module.Truncation(1.0, top_k, top_p, min_p)
    expected = _vllm_reference(logits, top_k, top_p, min_p)
    sampled = torch.multinomial(logits.masked_fill(~expected, -float("inf")).softmax(-1), 1, generator=gen).squeeze(-1)
    assert torch.equal(patch_module.kept_mask(logits, sampled, truncation), expected)
    log_kept, full = patch_module.log_kept_mass(logits, sampled, truncation)
    probs = logits.softmax(-1)
    assert torch.allclose(log_kept.exp(), (probs * expected).sum(-1), atol=1e-5)
    assert torch.allclose(full, probs.gather(-1, sampled[:, None]).squeeze(-1).log(), atol=1e-5)


def test_truncation_of_reads_the_fields_and_generation_kwargs():
    class Args:
        generation_kwargs = {"top_k": 20}

    class Trainer:
        use_vllm, vllm_importance_sampling_correction, temperature = True, True, 0.7
        top_k, top_p, min_p, args = 0, 1.0, None, Args()

    assert patch_module.truncation_of(Trainer()) == patch_module.Truncation(0.7, 20, 1.0, 0.0)
    Args.generation_kwargs = None
    assert patch_module.truncation_of(Trainer()) is None  # the full distribution: nothing to replay
    Trainer.top_k = -1
    Trainer.top_p = 0.9
    assert patch_module.truncation_of(Trainer()) == patch_module.Truncation(0.7, 0, 0.9, 0.0)
    Trainer.vllm_importance_sampling_correction = False
    assert patch_module.truncation_of(Trainer()) is None


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_installed_trl():
    grpo = importlib.import_module("trl.trainer.grpo_trainer")
    verdict = patch_module.probe(grpo)
    if TRL >= Version("0.24.0"):
        assert verdict.needed is True, verdict  # no release has fixed it (1.16.0 included)
    else:  # before processed_logprobs (e086f073c) the gate answers; the probe must not claim the bug
        assert verdict.needed is not True, verdict


_V126 = """
class GRPOTrainer:
    def __init__(self, args):
        self.llm = LLM(model=args.model, logprobs_mode="processed_logprobs")

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep):
        return model(input_ids).logits

    def _generate_and_score_completions(self, inputs):
        if self.use_vllm and self.vllm_importance_sampling_correction:
            diff = (old_per_token_logps - sampling_per_token_logps) * mask
"""


@pytest.mark.parametrize(
    "body, needed",
    [
        (_V126, True),
        # the day TRL replays the truncation in the trainer (issue #6789)
        (_V126.replace("return model(input_ids).logits", "return apply_top_k_top_p(logits, self.top_k, self.top_p)"), False),
        (_V126.replace("* mask", "* mask * sampling_mask"), False),
        (_V126.replace("self.vllm_importance_sampling_correction", "False"), False),
        (_V126.replace('logprobs_mode="processed_logprobs"', 'logprobs_mode="raw_logprobs"'), None),
        (_V126.replace("(old_per_token_logps - sampling_per_token_logps)", "ratio(old, sampling)"), None),
    ],
)
def test_probe_on_code(code_module, body, needed):
    module = code_module(body)
    assert patch_module.probe(module).needed is needed
