"""Positive controls of the off-policy guard: each known silent bug, with its patch switched off, is
caught by its named check in a real tiny GRPO run on the vLLM stand-in; with the patch on, no alarm."""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import grpo_run
    import tiny


def _needs(patch_id: str, versions=None):
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patches' trigger)

    if versions is not None and grpo_run.trl_version()[:2] not in versions:
        pytest.skip(f"{patch_id}'s bug is in TRL {versions}")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    if trl_compat.status(patch_id) != trl_compat.APPLIED:
        pytest.skip(f"{patch_id} does not apply in this cell")


def _shared_prefix_dataset(n=8):
    from datasets import Dataset

    words = tiny.vocab_words()
    shared = words[100:120]
    return Dataset.from_dict({"prompt": [" ".join(shared + [words[(i * 37 + j * 11) % 90] for j in range(5)]) for i in range(n)]})


def test_prefix_cache_never_reset_is_caught_by_C_at_step_1(tmp_path, unpatched, guard):
    _needs("vllm-prefix-cache", versions=[(0, 15)])
    with unpatched("vllm-prefix-cache"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, train_dataset=_shared_prefix_dataset(), max_prompt_length=64)
        trainer.train()
    found = [a for a in guard() if a.check == "C"]
    assert [a.step for a in found] == [1, 2]
    assert found[0].fix == "vllm-prefix-cache" and found[0].figures == {"last_sync_step": 1}


def test_prefix_cache_reset_no_alarm(tmp_path, guard):
    _needs("vllm-prefix-cache", versions=[(0, 15)])
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, train_dataset=_shared_prefix_dataset(), max_prompt_length=64)
    trainer.train()
    assert guard() == []
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["offpolicy/alarm"] for h in history] == [0.0, 0.0, 0.0]
    assert all(h["offpolicy/rows_checked"] > 0 for h in history)
