"""The off-policy guard in server mode (``vllm_mode="server"``, TRL 0.18+ cells with vLLM): what the
client side can check of a ``trl vllm-serve`` server, through TRL's real ``VLLMClient`` whose HTTP
session is a fake server (no NCCL, no weight transfer: ``update_named_param`` is recorded only).

* P: before TRL 0.24 the server gets text and returns no prompt ids: the guard re-does the server's
  tokenisation (``encode(text)``) with the trainer's tokenizer. Positive control: 0.18's prompt
  truncation with ``vllm-prompt-truncation`` off (the whole text goes to the server). From 0.24 the
  server's ``prompt_ids`` are the loss's by construction: checked, never different.
* S: the sampling arguments sent. Positive control: a ``generation_kwargs`` temperature (TRL 0.19+:
  it overrides the server's sampling) that the loss does not divide by.
* C: a weight sync (``update_named_param``) must be followed by ``reset_prefix_cache`` before the
  next ``generate``. Positive control: a client whose ``reset_prefix_cache`` TRL's call never reaches.
* Clean: a patched server-mode run of 3 steps, no alarm, every completion matched.
"""

from __future__ import annotations

import importlib.util
import zlib

import trl_compat

import pytest

from fake_http import JsonResponse

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import grpo_run
    import tiny

MAX_PROMPT = 16


def _server_cell():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patches' trigger)

    if grpo_run.trl_version()[:2] < (0, 18):
        pytest.skip("server-mode runs are wired here from TRL 0.18 (0.16/0.17 cells have no vLLM installed)")
    if grpo_run.trl_version()[:2] >= (1, 11):
        # TRL 1.11 (PR #6765) talks to vLLM's own OpenAI-compatible server (/v1/models, weight transfer
        # over vLLM's engine): the fake session here speaks TRL's own server of 0.16 - 1.10
        pytest.skip("TRL >= 1.11's client speaks vLLM's own server, which this fake session does not imitate")
    if not grpo_run.standin_vllm_installed():
        pytest.skip("TRL's server mode needs an importable vllm (the stand-in)")
    from trl.import_utils import is_vllm_available

    if not is_vllm_available():
        pytest.skip("trl.import_utils.is_vllm_available() is False")


class FakeServer:
    """``trl vllm-serve``'s /generate/ (and /chat/) as a client sees it: the text tokenised with special tokens
    (vLLM's way; ``truncate_prompt_tokens`` keeps the last ids), ``n`` completions per prompt whose
    ids depend on the prompt (none is EOS or pad), and their log-probs."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests = []

    def post(self, url, json=None, **kwargs):
        self.requests.append((url, json))
        if url.endswith("/chat/"):  # TRL 0.26+: conversations; the server applies the chat template
            texts = [" ".join(m["content"] for m in conversation) for conversation in json["messages"]]
        elif url.endswith("/generate/"):
            texts = json["prompts"]
        else:
            return JsonResponse({})
        n, max_tokens, truncate = json["n"], json["max_tokens"], json.get("truncate_prompt_tokens")
        prompt_ids, completion_ids = [], []
        for text in texts:
            # TRL 0.29+ sends the prompts as token ids
            ids = list(text) if isinstance(text, list) else self.tokenizer(text)["input_ids"]
            prompt_ids.append(ids[-truncate:] if truncate else ids)
            seed = zlib.crc32(str(text).encode())
            for k in range(n):
                completion_ids.append([3 + (seed + 7 * k + 13 * j * (k + 1)) % (tiny.VOCAB_SIZE - 3) for j in range(max_tokens)])
        body = {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": [[-1.0] * max_tokens for _ in completion_ids]}
        if "logprobs" in json:  # TRL 0.29+: per token, rank-sorted lists and their token ids
            body["logprobs"] = [[[-1.0]] * max_tokens for _ in completion_ids]
            body["logprob_token_ids"] = [[[token] for token in ids] for ids in completion_ids]
        return JsonResponse(body)

    def get(self, url, **kwargs):
        return JsonResponse({})


@pytest.fixture
def server_mode(monkeypatch):
    """TRL's real VLLMClient without a server: no health check, no NCCL group; syncs recorded."""
    _server_cell()  # before the client module is imported: TRL < 0.16 has none
    import torch

    module = "trl.generation.vllm_client" if grpo_run.trl_version()[:2] >= (0, 28) else "trl.extras.vllm_client"
    client_cls = importlib.import_module(module).VLLMClient
    calls = []
    monkeypatch.setattr(client_cls, "check_server", lambda self, *a, **k: None)
    monkeypatch.setattr(client_cls, "init_communicator", lambda self, *a, **k: None)
    monkeypatch.setattr(client_cls, "update_named_param", lambda self, name, weights: calls.append(("sync", name)))
    monkeypatch.setattr(client_cls, "reset_prefix_cache", lambda self: calls.append(("reset", None)))
    monkeypatch.setattr(client_cls, "close_communicator", lambda self: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return calls


def _long_text_dataset():
    from datasets import Dataset

    words = tiny.vocab_words()
    return Dataset.from_dict({"prompt": [" ".join(words[(i * 31 + j * 7) % 400] for j in range(20)) for i in range(4)]})


def _server_trainer(tmp_path, steps=3, dataset=None, chat_template=None, **overrides):
    from trl import GRPOTrainer

    tokenizer = tiny.make_tokenizer()
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    args, _ = grpo_run.make_config(
        tmp_path / "out",
        steps=steps,
        vllm_mode="server",
        vllm_server_host="127.0.0.1",
        vllm_server_timeout=1,
        max_prompt_length=MAX_PROMPT,
        **overrides,
    )
    args.use_vllm = True
    trainer = GRPOTrainer(
        model=tiny.save_tiny(tmp_path / "tiny-qwen2", "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=dataset if dataset is not None else tiny.prompt_dataset(8),
        processing_class=tokenizer,
    )
    client = getattr(trainer, "vllm_client", None) or trainer.vllm_generation.vllm_client
    client.session = FakeServer(tokenizer)
    return trainer, client


def test_server_mode_clean_run_no_alarm(tmp_path, server_mode, guard):
    _server_cell()
    trainer, client = _server_trainer(tmp_path)
    trainer.train()
    assert guard() == []
    generates = [r for r in client.session.requests if r[0].endswith("/generate/")]
    assert len(generates) == 3  # one request a step, on the main process
    assert ("reset", None) in server_mode and any(kind == "sync" for kind, _ in server_mode)
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["offpolicy/alarm"] for h in history] == [0.0, 0.0, 0.0]
    # every completion the loss trains on was matched to the server's answer and its prompt checked
    assert [h["offpolicy/rows_checked"] for h in history] == [float(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)] * 3
    assert all(h["offpolicy/prompt_mismatch_rows"] == 0.0 for h in history)


def test_server_mode_prompt_truncation_is_caught_by_P(tmp_path, server_mode, unpatched, guard):
    _server_cell()
    if trl_compat.status("vllm-prompt-truncation") != trl_compat.APPLIED:
        pytest.skip("vllm-prompt-truncation does not apply in this cell")
    trainer, client = _server_trainer(tmp_path, steps=2, dataset=_long_text_dataset())
    with unpatched("vllm-prompt-truncation"):
        trainer.train()
    alarms = [a for a in guard() if a.check == "P"]
    assert [a.step for a in alarms] == [0, 1], guard()
    first = alarms[0]
    assert first.fix == "vllm-prompt-truncation"
    assert first.figures["engine_len"] == 20 and first.figures["loss_len"] == MAX_PROMPT
    assert first.figures["mismatched"] == first.figures["rows"] == grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE
    assert "re-done here" in first.what  # simulated: the server returns no prompt ids before 0.24
    assert {a.check for a in guard()} == {"P"}


def test_server_mode_truncation_patched_no_alarm(tmp_path, server_mode, guard):
    _server_cell()
    if trl_compat.status("vllm-prompt-truncation") != trl_compat.APPLIED:
        pytest.skip("vllm-prompt-truncation does not apply in this cell")
    trainer, _ = _server_trainer(tmp_path, steps=2, dataset=_long_text_dataset())
    trainer.train()
    assert guard() == []
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["offpolicy/rows_checked"] > 0 for h in history)


def test_server_mode_temperature_override_is_caught_by_S(tmp_path, server_mode, guard):
    _server_cell()
    if "generation_kwargs" not in grpo_run.grpo_config_fields():
        pytest.skip("generation_kwargs reach the server from TRL 0.19")
    trainer, client = _server_trainer(tmp_path, steps=1, generation_kwargs={"temperature": 0.5})
    trainer.train()
    alarms = [a for a in guard() if a.check == "S"]
    assert [a.step for a in alarms] == [0]
    assert alarms[0].figures == {"vllm_temperature": 0.5, "loss_temperature": trainer.temperature}
    assert alarms[0].fix is None and "generation_kwargs" in alarms[0].cause
    sent = [body for url, body in client.session.requests if url.endswith("/generate/")]
    assert sent[0]["generation_kwargs"] == {"temperature": 0.5}


def test_server_mode_missing_prefix_cache_reset_is_caught_by_C_at_step_1(tmp_path, server_mode, guard):
    _server_cell()
    trainer, client = _server_trainer(tmp_path, steps=3)
    client.reset_prefix_cache = lambda: None  # TRL's call no longer reaches the server (nor the guard)
    trainer.train()
    alarms = [a for a in guard() if a.check == "C"]
    assert [a.step for a in alarms] == [1, 2]
    assert alarms[0].figures == {"last_sync_step": 1} and "prefix cache was not reset" in alarms[0].what
    assert ("reset", None) not in server_mode


def test_server_mode_chat_clean_run_no_alarm(tmp_path, server_mode, guard):
    """TRL 0.26+ sends conversations through ``VLLMClient.chat``: guarded too (C, S, and P on the
    prompt ids the server returns, which TRL trains on)."""
    _server_cell()
    if not (0, 26) <= grpo_run.trl_version()[:2] < (0, 29):
        pytest.skip("TRL < 0.26 sends conversations as text, 0.29+ as token ids, both through generate")
    from datasets import Dataset

    texts = tiny.prompt_dataset(8)["prompt"]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in texts])
    trainer, client = _server_trainer(
        tmp_path, steps=2, dataset=dataset, chat_template="{% for message in messages %}{{ message['content'] }} {% endfor %}"
    )
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and getattr(generation, "tools", None) == []:
        # TRL 0.28.x hands tools=[] to VLLMClient.chat, which raises NotImplementedError on any tools that is
        # not None until 0.29.0 (`if tools:`): tools-empty-list-server's bug, outside its 0.26 window
        generation.tools = None
    trainer.train()
    assert guard() == []
    assert [url for url, _ in client.session.requests if url.endswith("/chat/")], client.session.requests
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["offpolicy/rows_checked"] for h in history] == [float(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)] * 2
    assert all(h["offpolicy/alarm"] == 0.0 for h in history)
