"""Positive controls of the off-policy guard: each known silent bug, with its patch switched off, is
caught by its named check in a real tiny GRPO run on the vLLM stand-in; with the patch on, no alarm.

| bug (patch)                                   | check | step   | cells (tests/support/expected_status.py) |
|-----------------------------------------------|-------|--------|------------------------------------------|
| 0.15 prefix cache (vllm-prefix-cache)         | C     | 1      | 0.15.x                                   |
| prompt truncation (vllm-prompt-truncation)    | P     | 0      | 0.14.0-tf4.46.3, 0.15.x, 0.18.2          |
| double BOS (vllm-double-bos)                  | P     | 0      | 0.14 - 0.23.1 (Llama-3-style tokenizer)  |
| stripped special tokens (vllm-prompt-special-tokens) | P | 0   | 0.19.0                                   |
| temperature (logps-temperature, opt-in, off)  | S     | 0      | 0.14 / 0.15 (temperature=0.9)            |
| sleep-mode reload (vllm-sleep-mode-weights)   | C     | 1 (0.28+); the second evaluate (0.26 - 0.27) | 0.26 - 0.29 |
| the same on TRL 1.x (vllm-sleep-mode-weights) | C, W2 | 1      | 1.0.0 - 1.9.2; 1.10+ (fixed upstream): none |

Server mode: tests/guard/test_server_mode.py; a real vLLM: tests/vllm_real/test_guard_real.py."""

from __future__ import annotations

import trl_compat

import pytest

import guard_runs

HAVE_TORCH = guard_runs.HAVE_TORCH

if HAVE_TORCH:
    import grpo_run
    import tiny


def _needs(patch_id: str, versions=None):
    guard_runs.vllm_run_or_skip(None if versions is None else (lambda v: v in versions), patch_id)


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


# -- P: the prompt vLLM generated from is not the loss's prompt --------------------------------------

MAX_PROMPT = 16
BOS_ID, HEADER_START, HEADER_END, EOT = 3, 4, 5, 6  # tiny.make_llama3_tokenizer()'s special ids


def _long_text_dataset():
    from datasets import Dataset

    words = tiny.vocab_words()
    # 20 words: longer than max_prompt_length (16), within the colocate max_model_len (16 + 8)
    return Dataset.from_dict({"prompt": [" ".join(words[(i * 31 + j * 7) % 400] for j in range(20)) for i in range(4)]})


def _chat_dataset(words_per_prompt=3):
    from datasets import Dataset

    words = tiny.llama3_vocab_words()[3:]
    prompts = [
        [{"role": "user", "content": " ".join(words[(i * 31 + j * 7) % 400] for j in range(words_per_prompt))}] for i in range(4)
    ]
    return Dataset.from_dict({"prompt": prompts})


def _prompt_run(tmp_path, tokenizer, dataset, steps=2):
    path = tiny.save_tiny(tmp_path / "model", "llama", tokenizer=tokenizer)  # vLLM loads this tokenizer
    trainer = grpo_run.make_trainer(
        tmp_path,
        model=path,
        use_vllm=True,
        steps=steps,
        train_dataset=dataset,
        processing_class=tokenizer,
        max_prompt_length=MAX_PROMPT,
        max_completion_length=8,
    )
    trainer.train()
    return trainer


def _prompt_alarms(found):
    alarms = [a for a in found if a.check == "P"]
    assert alarms, found
    return alarms


def _assert_clean(trainer, found):
    assert found == []
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert history and all(h["offpolicy/alarm"] == 0.0 for h in history), history
    assert all(h["offpolicy/rows_checked"] > 0 for h in history)
    assert all(h.get("offpolicy/prompt_mismatch_rows", 0.0) == 0.0 for h in history)


def test_prompt_truncation_is_caught_by_P_at_step_0(tmp_path, unpatched, guard):
    _needs("vllm-prompt-truncation")
    with unpatched("vllm-prompt-truncation"):
        _prompt_run(tmp_path, tiny.make_tokenizer(), _long_text_dataset())
    alarms = _prompt_alarms(guard())
    assert [a.step for a in alarms] == [0, 1]  # every step: each batch has new, too long prompts
    first = alarms[0]
    assert first.fix == "vllm-prompt-truncation"
    # vLLM got all 20 ids of every row, the loss the last 16
    assert first.figures["engine_len"] == 20 and first.figures["loss_len"] == MAX_PROMPT
    assert first.figures["mismatched"] == first.figures["rows"] > 0
    assert "max_prompt_length" in first.cause


def test_prompt_truncation_patched_no_alarm(tmp_path, guard):
    _needs("vllm-prompt-truncation")
    trainer = _prompt_run(tmp_path, tiny.make_tokenizer(), _long_text_dataset())
    _assert_clean(trainer, guard())


def test_double_bos_is_caught_by_P_at_step_0(tmp_path, unpatched, guard):
    _needs("vllm-double-bos")
    tok = tiny.make_llama3_tokenizer()
    with unpatched("vllm-double-bos"):
        _prompt_run(tmp_path, tok, _chat_dataset())
    alarms = _prompt_alarms(guard())
    assert [a.step for a in alarms] == [0, 1]
    first = alarms[0]
    assert first.fix == "vllm-double-bos"
    # vLLM: BOS BOS <header> ..., the loss: BOS <header> ...; they differ from position 1 on
    assert first.figures["engine_len"] == first.figures["loss_len"] + 1
    assert first.figures["position"] == 1 and first.figures["mismatched"] == first.figures["rows"]
    assert f"[{BOS_ID}, {BOS_ID}, {HEADER_START}" in first.what


def test_double_bos_patched_no_alarm(tmp_path, guard):
    _needs("vllm-double-bos")
    trainer = _prompt_run(tmp_path, tiny.make_llama3_tokenizer(), _chat_dataset())
    _assert_clean(trainer, guard())


def test_stripped_special_tokens_are_caught_by_P_at_step_0(tmp_path, unpatched, guard):
    _needs("vllm-prompt-special-tokens")
    tok = tiny.make_llama3_tokenizer()
    with unpatched("vllm-prompt-special-tokens"):
        _prompt_run(tmp_path, tok, _chat_dataset())
    alarms = _prompt_alarms(guard())
    assert [a.step for a in alarms] == [0, 1]
    first = alarms[0]
    assert first.fix == "vllm-prompt-special-tokens"
    # 0.19.0 decodes the prompt with skip_special_tokens=True: BOS, the two header ids, EOT and the
    # second header pair are gone (3 words: 12 ids for the loss, the 3 words + "user"/"assistant"... for vLLM)
    assert first.figures["engine_len"] < first.figures["loss_len"]
    assert first.figures["position"] == 0 and first.figures["mismatched"] == first.figures["rows"]


def test_stripped_special_tokens_patched_no_alarm(tmp_path, guard):
    _needs("vllm-prompt-special-tokens")
    trainer = _prompt_run(tmp_path, tiny.make_llama3_tokenizer(), _chat_dataset())
    _assert_clean(trainer, guard())


# -- S: vLLM samples at a temperature the loss does not divide by -------------------------------------

TEMPERATURE = 0.9


@pytest.fixture
def logps_temperature(monkeypatch):
    """``logps_temperature(on)`` re-probes the opt-in patch with its switch set or not; undone afterwards."""
    from trl_compat.patches import logps_temperature as lt

    def set_to(on):
        if on:
            monkeypatch.setenv(lt.SWITCH, "1")
        else:
            monkeypatch.delenv(lt.SWITCH, raising=False)
        trl_compat.revert("logps-temperature")
        trl_compat.install("logps-temperature")
        return trl_compat.status("logps-temperature")

    yield set_to
    monkeypatch.delenv(lt.SWITCH, raising=False)
    trl_compat.revert("logps-temperature")
    trl_compat.install("logps-temperature")


def _temperature_cell(switch, on):
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401

    if grpo_run.trl_version()[:2] >= (0, 16):
        pytest.skip("TRL >= 0.16 computes log-probs at the sampling temperature")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    assert switch(on) == (trl_compat.APPLIED if on else trl_compat.DISABLED)


def test_temperature_is_caught_by_S_at_step_0(tmp_path, logps_temperature, guard):
    _temperature_cell(logps_temperature, on=False)  # the default: opt-in, off
    grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, temperature=TEMPERATURE).train()
    alarms = [a for a in guard() if a.check == "S"]
    assert [a.step for a in alarms] == [0, 1]  # once per generate call, one call a step
    first = alarms[0]
    assert first.figures == {"vllm_temperature": TEMPERATURE, "loss_temperature": 1.0}
    assert first.fix == "logps-temperature" and "PR #3029" in first.cause
    assert {a.check for a in guard()} == {"S"}


def test_temperature_fixed_no_alarm(tmp_path, logps_temperature, guard):
    _temperature_cell(logps_temperature, on=True)
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, temperature=TEMPERATURE)
    trainer.train()
    _assert_clean(trainer, guard())


# -- C: the sleep-mode reload after a weight sync (TRL #5312) ----------------------------------------


def _sleep_cell():
    _needs("vllm-sleep-mode-weights")
    if grpo_run.trl_version()[:2] < (0, 26):
        pytest.skip("TRL < 0.26 does not reload the checkpoint on wake-up")


def _sleep_run(tmp_path):
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
    assert trainer.args.vllm_enable_sleep_mode and trainer.args.vllm_mode == "colocate"
    trainer.train()
    eval_dataset = tiny.prompt_dataset(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)
    trainer.evaluate(eval_dataset=eval_dataset)
    trainer.evaluate(eval_dataset=eval_dataset)  # same global_step: 0.26 - 0.27 reload and do not sync
    return trainer


def test_sleep_mode_reload_is_caught_by_C(tmp_path, unpatched, guard):
    _sleep_cell()
    with unpatched("vllm-sleep-mode-weights"):
        _sleep_run(tmp_path)
    alarms = [a for a in guard() if a.check == "C"]
    assert alarms and all(a.fix == "vllm-sleep-mode-weights" and "reload_weights" in a.what for a in alarms), alarms
    if grpo_run.trl_version()[:2] >= (0, 28):
        # 0.28+: sync, then generate's wake + reload: every generation after step 0 runs on the checkpoint
        assert alarms[0].step == 1 and alarms[0].figures == {"last_sync_step": 1}
        assert sorted({a.step for a in alarms}) == [1, 2, 3]
    else:
        # 0.26 - 0.27: wake + reload, then a sync on a new step only: the second evaluate at step 3
        assert {a.step for a in alarms} == {3} and alarms[0].figures == {"last_sync_step": 3}


def test_sleep_mode_patched_no_alarm(tmp_path, guard):
    _sleep_cell()
    _sleep_run(tmp_path)
    assert guard() == []


# -- the same on TRL 1.x: 1.0.0 - 1.9.2 carry 0.28's reload; 1.10.0 fixed it (PR #5313) -------------------------


def test_sleep_mode_reload_on_1x_is_caught_by_C_and_W2_at_step_1(tmp_path, unpatched, guard):
    guard_runs.vllm_run_or_skip(lambda v: v >= (1, 0), "vllm-sleep-mode-weights")
    with unpatched("vllm-sleep-mode-weights"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
        assert trainer.args.vllm_enable_sleep_mode and trainer.args.vllm_mode == "colocate"
        trainer.train()
    found = guard()
    c, w2 = [a for a in found if a.check == "C"], [a for a in found if a.check == "W2"]
    assert {a.check for a in found} == {"C", "W2"}, [a.line() for a in found]
    # every generation after step 0 (steps 1 and 2 of 3) runs on the checkpoint reloaded from disk
    assert [a.step for a in c] == [1, 2] and [a.step for a in w2] == [1, 2], [a.line() for a in found]
    assert c[0].figures == {"last_sync_step": 1} and "reload_weights" in c[0].what
    assert w2[0].figures["kind"] == "vLLM holds the initial/on-disk weights" and w2[0].figures["frac"] > 0.5
    assert all(a.fix == "vllm-sleep-mode-weights" for a in found)


def test_sleep_mode_fixed_upstream_no_alarm(tmp_path, guard):
    """TRL 1.10+: the patch says "not needed" and TRL's own sleep mode runs clean under the guard."""
    guard_runs.vllm_run_or_skip(lambda v: v >= (1, 10))
    assert trl_compat.status("vllm-sleep-mode-weights") == trl_compat.NOT_NEEDED, trl_compat.report()
    _sleep_run(tmp_path)
    assert guard() == []
