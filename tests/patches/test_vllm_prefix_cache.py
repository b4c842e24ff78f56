"""vllm-prefix-cache (TRL 0.15.x): no prompt prefix cached under older weights may be reused
after a weight sync.

* The stand-in's model of vLLM's prefix cache (cells with the stand-in): content-keyed full
  blocks, kept across ``load_weights``, emptied by ``reset_prefix_cache()``.
* Real 3-step GRPO runs with ``use_vllm`` on TRL 0.15.x and prompts sharing a 20-word prefix:
  without the patch, steps 1 and 2 are generated from a prefix cached at step 0 (stale blocks
  counted by the stand-in); with it, one reset per sync, no stale block, and prompts repeated
  within a step still hit the cache.
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

PID = "vllm-prefix-cache"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import grpo_run
    import tiny


requires_standin = pytest.mark.skipif(
    not HAVE_TORCH or not grpo_run.standin_vllm_installed(), reason="the vLLM stand-in is not installed"
)


@requires_standin
def test_standin_prefix_cache_outlives_load_weights_until_reset(tmp_path):
    from vllm import LLM, SamplingParams

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    llm = LLM(model=path, gpu_memory_utilization=0.5, dtype="float32", enable_prefix_caching=True)
    prompt = " ".join(tiny.vocab_words()[:40])  # 40 tokens: blocks end at 16 and 32, then a partial one
    params = SamplingParams(temperature=0.0, max_tokens=2)

    def cached():
        llm.generate(prompt, params, use_tqdm=False)
        last = llm.prefix_cache_log[-1]
        return last["hit_tokens"], last["stale_tokens"]

    assert cached() == (0, 0)
    assert cached() == (32, 0)
    llm.model.load_weights(tiny.make_model("qwen2", seed=1).state_dict().items())
    assert cached() == (32, 32)  # content-keyed: the blocks computed by the old weights are served
    assert llm.reset_prefix_cache() is True
    assert cached() == (0, 0)
    assert cached() == (32, 0)

    plain = LLM(model=path, gpu_memory_utilization=0.5, dtype="float32")
    plain.generate([prompt, prompt], params, use_tqdm=False)
    assert plain.prefix_cache_log == []


def _dataset(n=8):
    from datasets import Dataset

    words = tiny.vocab_words()
    shared = words[100:120]  # like a system prompt: 20 tokens, one full block
    return Dataset.from_dict({"prompt": [" ".join(shared + [words[(i * 37 + j * 11) % 90] for j in range(5)]) for i in range(n)]})


def _grpo_on_015_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    if grpo_run.trl_version()[:2] != (0, 15):
        pytest.skip("the bug is in TRL 0.15.x (cells trl0.15.*); 0.14.0 does not cache prefixes, 0.16 resets")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    # in these cells the patch must be on: a switched-off patch fails here, it does not skip
    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    return grpo_run


def _train(grpo_run, tmp_path):
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, train_dataset=_dataset(), max_prompt_length=64)
    llm = trainer.llm
    assert llm.enable_prefix_caching  # TRL 0.15 turns it on
    versions_before = llm.model.weights_version
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    syncs = llm.model.weights_version - versions_before
    assert syncs == 2  # before steps 1 and 2
    return llm, syncs


def test_bug_reproduced_without_the_patch(tmp_path, unpatched):
    grpo_run = _grpo_on_015_or_skip()
    with unpatched(PID):
        llm, _ = _train(grpo_run, tmp_path)
    assert llm.prefix_cache_resets == 0
    log = llm.prefix_cache_log
    assert len(log) == 3 and log[0]["stale_tokens"] == 0
    # steps 1 and 2: every request's shared block was computed by the step-0 weights
    assert [entry["stale_tokens"] for entry in log[1:]] == [2 * 16 * 2, 2 * 16 * 2]


def test_patched_resets_after_every_sync(tmp_path):
    grpo_run = _grpo_on_015_or_skip()
    llm, syncs = _train(grpo_run, tmp_path)
    assert llm.prefix_cache_resets == syncs
    log = llm.prefix_cache_log
    assert len(log) == 3
    assert [entry["stale_tokens"] for entry in log] == [0, 0, 0]
    # the cache still does its job within a step: 4 requests share one block, 3 of them hit it
    assert [entry["hit_tokens"] for entry in log] == [3 * 16, 3 * 16, 3 * 16]


@pytest.mark.parametrize(
    "body, verdict",
    [
        # 0.15.0 - 0.15.2: caching on, a sync method, no reset
        (
            "def __init__(self):\n        self.llm = LLM(enable_prefix_caching=True)\n"
            "    def _move_model_to_vllm(self):\n        load_weights(sd)\n",
            True,
        ),
        # early 0.15.0.dev0: caching on, weights loaded inline
        (
            "def __init__(self):\n        self.llm = LLM(enable_prefix_caching=True)\n"
            "    def compute_loss(self):\n        load_weights(sd)\n",
            None,
        ),
        # 0.16 - 0.18: the cache is reset after each sync
        ("def _move_model_to_vllm(self):\n        self.vllm_client.reset_prefix_cache()\n", False),
        # 0.14.0: no prefix caching
        ("def __init__(self):\n        self.llm = LLM(model=m)\n", False),
    ],
)
def test_probe_reads_the_module_source(code_module, body, verdict):

    from trl_compat.patches import vllm_prefix_cache

    module = code_module(f"class GRPOTrainer:\n    {body}")
    assert vllm_prefix_cache.probe(module).needed is verdict


def test_stays_above_vllm_merged_weights_through_revert_and_install():
    """On 0.15.0 both patches wrap _move_model_to_vllm; trl_compat's sync does not call the method
    below it, so the reset must stay on top, whatever is reverted and installed again."""
    _grpo_on_015_or_skip()
    from trl_compat import _engine

    from trl.trainer.grpo_trainer import GRPOTrainer

    merged = "vllm-merged-weights"
    if trl_compat.status(merged) != trl_compat.APPLIED:
        pytest.skip("vllm-merged-weights is not needed with this TRL")

    def on_top():  # the patch whose wrapper is the top one: its marker is not on what it wraps
        top = vars(GRPOTrainer)["_move_model_to_vllm"]
        (patch_id,) = _engine.markers(top) - _engine.markers(getattr(top, "__wrapped__", None))
        return patch_id

    assert on_top() == PID
    trl_compat.revert(merged)
    assert on_top() == PID and trl_compat.status(PID) == trl_compat.APPLIED
    trl_compat.install(merged)
    assert on_top() == PID
    assert {trl_compat.status(PID), trl_compat.status(merged)} == {trl_compat.APPLIED}
