"""vllm-is-raw-logprobs: TRL 0.23.x's colocated ``LLM(...)`` has no ``logprobs_mode``, so the
importance-sampling correction divides the trainer's tempered log-probs by vLLM's RAW ones.

* trl0.23.1-tf4.56.2 (the stand-in as vLLM 0.10.2, which returns raw or processed log-probs as
  ``logprobs_mode`` says): a real 1-step GRPO run, ``use_vllm=True``, ``vllm_mode="colocate"``,
  ``temperature=0.7``, on a tiny model whose logits are scaled up (a near-uniform random model's
  distribution barely changes with the temperature). Without the patch the per-token
  ``importance_sampling_ratio`` TRL computes (``exp(old - sampling)``, capped at 2) is systematically
  above 1 and the logged ``sampling/importance_sampling_ratio/mean`` far above 1; with it the engine is built with
  ``logprobs_mode="processed_logprobs"`` and the ratio is 1 up to float16 noise (the engine runs the
  float32 checkpoint in float16, vLLM's ``dtype="auto"``).
* The probe on the real TRL of each cell: needed on 0.23.x, not needed on 0.24+ (``logprobs_mode``
  passed) and before 0.23 (no IS correction); and on code written here.
* The wrapper: added only where the caller passed no ``logprobs_mode``; one warning on vLLM < 0.10.2.
"""

from __future__ import annotations

import importlib
import logging

import trl_compat
from trl_compat._helpers import vllm_logprobs
from trl_compat.patches import vllm_is_raw_logprobs as patch_module

import pytest
from packaging.version import Version

from versions import installed

PATCH_ID = "vllm-is-raw-logprobs"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and Version("0.23.0") <= TRL < Version("0.24.0") and VLLM is not None
in_window = pytest.mark.skipif(not IN_WINDOW, reason="TRL 0.23.x with the vLLM stand-in (the trl0.23.1-tf4.56.2 cell)")


def _scaled_model():
    import torch

    import tiny

    model = tiny.make_model("qwen2")
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked next-token distributions: the temperature matters
    return model


def _run(tmp_path):
    """One real GRPO step on the stand-in at temperature 0.7; returns (the batch TRL scored, its logs)."""
    import grpo_run
    import tiny

    path = tiny.save_tiny(tmp_path / "scaled", model=_scaled_model())  # vLLM loads it by path
    trainer = grpo_run.make_trainer(tmp_path, model=path, use_vllm=True, steps=1, temperature=0.7)
    batches = []
    original = trainer._generate_and_score_completions

    def recording(*args, **kwargs):
        batch = original(*args, **kwargs)
        batches.append(batch)
        return batch

    trainer._generate_and_score_completions = recording
    trainer.train()
    llm = grpo_run.trainer_llm(trainer)
    (batch,) = batches
    logged = next(e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in e)
    return llm, batch, logged


def _log_ratio(batch):
    """log of the per-token ratio TRL weights the loss with, exp(old - sampling) capped at 2.0."""
    mask = batch["completion_mask"].bool()
    return batch["importance_sampling_ratio"][mask].log()


@in_window
def test_raw_logprobs_pin_the_ratio_without_the_patch(tmp_path, unpatched):
    importlib.import_module("trl.trainer.grpo_trainer")  # the patch's trigger
    with unpatched(PATCH_ID):
        llm, batch, logged = _run(tmp_path)
    assert llm.logprobs_mode == "raw_logprobs"
    log_ratio = _log_ratio(batch)
    # tempered (T=0.7) log-probs of the sampled tokens are higher than their raw ones, token after token
    assert log_ratio.mean().item() > 0.1 and (log_ratio > 0.02).float().mean().item() > 0.6, log_ratio
    assert logged["sampling/importance_sampling_ratio/mean"] > 1.1, logged
    assert logged["sampling/sampling_logp_difference/mean"] > 0.1, logged


@in_window
def test_processed_logprobs_keep_the_ratio_at_one(tmp_path):
    importlib.import_module("trl.trainer.grpo_trainer")  # the patch's trigger
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    llm, batch, logged = _run(tmp_path)
    assert llm.logprobs_mode == "processed_logprobs" and llm.init_kwargs["logprobs_mode"] == "processed_logprobs"
    log_ratio = _log_ratio(batch)
    assert log_ratio.abs().max().item() < 0.05 and log_ratio.abs().mean().item() < 0.01, log_ratio
    assert abs(logged["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.01, logged
    assert logged["sampling/sampling_logp_difference/mean"] < 0.01, logged


@pytest.mark.skipif(TRL is None or VLLM is None, reason="needs TRL and vLLM (the stand-in)")
def test_probe_on_the_installed_trl():
    grpo = importlib.import_module("trl.trainer.grpo_trainer")
    verdict = patch_module.probe(grpo)
    assert verdict.needed is (Version("0.23.0") <= TRL < Version("0.24.0")), verdict
    if TRL >= Version("0.24.0") and TRL < Version("0.28.0"):
        assert "with a logprobs_mode" in verdict.reason
    elif TRL < Version("0.23.0"):
        assert "no vLLM importance-sampling correction" in verdict.reason


_V023 = """
class LLM:
    pass

class GRPOTrainer:
    def __init__(self, args):
        self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction
        self.llm = LLM(model=model.name_or_path, max_num_batched_tokens=4096)
"""


@pytest.mark.parametrize(
    "body, needed",
    [
        (_V023, True),
        (_V023.replace("max_num_batched_tokens=4096", 'logprobs_mode="processed_logprobs"'), False),
        (_V023.replace("self.vllm_importance_sampling_correction = args.vllm_importance_sampling_correction", "pass"), False),
        (_V023.replace("class LLM:\n    pass\n", "LLM = None\n"), None),
    ],
)
def test_probe_on_code(code_module, body, needed):
    module = code_module(body)
    assert patch_module.probe(module).needed is needed


def test_wrapper_adds_the_mode_only_when_missing(monkeypatch, caplog):
    class Real:
        def __init__(self, model, **kwargs):
            self.kwargs = kwargs

    warned = []
    cls = vllm_logprobs.processed_logprobs_llm(Real, PATCH_ID, warned.append)
    assert issubclass(cls, Real) and cls.__name__ == "Real"
    monkeypatch.setattr(vllm_logprobs, "vllm_version", lambda: (0, 10, 2))
    assert cls("m", seed=0).kwargs == {"seed": 0, "logprobs_mode": "processed_logprobs"}
    assert cls("m", logprobs_mode="raw_logprobs").kwargs == {"logprobs_mode": "raw_logprobs"}
    assert warned == []
    monkeypatch.setattr(vllm_logprobs, "vllm_version", lambda: (0, 10, 1, 1))
    assert cls("m").kwargs == {"logprobs_mode": "processed_logprobs"} and warned == [(0, 10, 1, 1)]
    monkeypatch.setattr(vllm_logprobs, "vllm_version", lambda: (0, 9, 1))  # no such EngineArgs field
    assert cls("m").kwargs == {}
    with caplog.at_level(logging.WARNING):
        vllm_logprobs._unsure("a-test-only-id")((0, 10, 0))  # warn_once: once per id and process
    assert "a-test-only-id: vLLM 0.10.0 built with logprobs_mode='processed_logprobs'" in caplog.text
