"""tools-empty-list-server: TRL 0.26.0's and 0.28.0's server mode sends tools=[] to VLLMClient.chat.

* Every cell: the probe on the real TRL source ("needed" only on 0.26.0's and 0.28.0's code) and on
  code written here; the wrapper binds ``tools`` by name.
* TRL 0.26.0 / 0.28.0 with vLLM installed (the trl0.26.0-tf4.57.3, trl0.28.0-tf4.57.6 and
  trl0.28.0-tf5.2.0 cells): a real tiny GRPO run in server mode
  (``use_vllm=True``, ``vllm_mode="server"``) with conversational prompts and no tools, whose real
  ``VLLMClient`` talks to a fake HTTP session (the error is raised client-side, before any request):
  without the patch the first generation raises ``NotImplementedError: Tool calling is not yet
  implemented in VLLMClient.chat().``; with it the step completes, TRL's ``chat`` body ran with
  ``tools=None`` and sent its /chat/ request with the conversations, and the policy trained.
"""

import inspect

import trl_compat
from trl_compat.patches import tools_empty_list_server as patch_module

import pytest
from packaging.version import Version

pytest.importorskip("torch")  # grpo_run and tiny build torch models: not in the notrl cell

import grpo_run
import tiny
from fake_http import JsonResponse
from versions import installed

PATCH_ID = "tools-empty-list-server"
TEMPLATE_ID = "tools-empty-list-template"  # fixes the same tools=[] at its source, in every mode
TRL, VLLM = installed("trl"), installed("vllm")
BUGGY = TRL is not None and (Version("0.26.0") <= TRL < Version("0.26.1") or Version("0.28.0") <= TRL < Version("0.29.0"))
IN_CELL = BUGGY and VLLM is not None
NO_TOOLS = "Tool calling is not yet implemented in VLLMClient.chat()"


@pytest.mark.skipif(TRL is None or TRL < Version("0.16.0"), reason="VLLMClient exists from TRL 0.16")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    if patch_module.client_class(grpo) is None:
        pytest.skip(f"trl {TRL}: no VLLMClient (vLLM's client needs requests)")
    verdict = patch_module.probe(grpo)
    assert verdict.needed is BUGGY, verdict
    if BUGGY:
        assert "tools or []" in verdict.reason


def test_probe_on_written_code():
    class Client:
        def chat(self, messages, tools=None):
            if tools is not None:
                raise NotImplementedError("Tool calling is not yet implemented in VLLMClient.chat().")

    class Fixed:
        def __init__(self, tools=None):
            self.tools = tools

    class Buggy:
        def __init__(self, tools=None):
            self.tools = tools or []

    class Module:
        VLLMClient = Client

    Module.GRPOTrainer = Buggy
    assert patch_module.probe(Module).needed is True
    Module.GRPOTrainer = Fixed
    assert patch_module.probe(Module).needed is False


def test_wrapper_binds_tools_by_name():
    seen = []

    def chat(self, messages, n=1, tools=None, chat_template=None):
        seen.append((messages, n, tools, chat_template))
        return "ok"

    wrapped = patch_module.no_empty_tools(chat)
    assert inspect.signature(wrapped) == inspect.signature(chat)
    wrapped(None, ["m"], tools=[])
    wrapped(None, ["m"], 2, [])  # positional: bound by name all the same
    wrapped(None, ["m"], tools=["t"])
    wrapped(None, ["m"])
    assert seen == [(["m"], 1, None, None), (["m"], 2, None, None), (["m"], 1, ["t"], None), (["m"], 1, None, None)]


# -- the real GRPO run in server mode, with a fake HTTP session behind TRL's real VLLMClient ------


class FakeSession:
    """What ``VLLMClient`` posts to ``trl vllm-serve``: each /chat/ request is recorded and answered
    with prompt ids (the conversations' text tokenised), ``n`` completions per prompt and logprobs."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.requests = []

    def post(self, url, json=None, **kwargs):
        self.requests.append((url, json))
        assert url.endswith("/chat/"), url
        n, max_tokens = json["n"], json["max_tokens"]
        prompt_ids = [self.tokenizer(" ".join(m["content"] for m in conv))["input_ids"] for conv in json["messages"]]
        completion_ids, logprobs = [], []
        for i in range(len(prompt_ids) * n):
            ids = [3 + (7 * i + 5 * j) % (tiny.VOCAB_SIZE - 3) for j in range(max_tokens)]
            completion_ids.append(ids)
            logprobs.append([-1.0] * len(ids))
        return JsonResponse({"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": logprobs})


def conversational_dataset(n=8):
    from datasets import Dataset

    texts = tiny.prompt_dataset(n)["prompt"]
    return Dataset.from_list([{"prompt": [{"role": "user", "content": text}]} for text in texts])


@pytest.fixture
def server_mode(monkeypatch):
    """TRL's real VLLMClient without a server: no health check, no NCCL group, no weight sync
    (recorded), CUDA's device index for ``init_communicator(device=torch.cuda.current_device())``."""
    import torch
    import trl.trainer.grpo_trainer as grpo

    VLLMClient = patch_module.client_class(grpo)  # trl.extras' up to 0.27, trl.generation's from 0.28
    synced = []
    monkeypatch.setattr(VLLMClient, "check_server", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMClient, "update_named_param", lambda self, name, weights: synced.append(name))
    monkeypatch.setattr(VLLMClient, "reset_prefix_cache", lambda self: None)
    monkeypatch.setattr(VLLMClient, "close_communicator", lambda self: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return synced


def server_trainer(tmp_path):
    """A real GRPOTrainer in server mode (grpo_run wires the stand-in's colocate mode only)."""
    from trl import GRPOTrainer

    tokenizer = tiny.make_tokenizer()
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
    args, _ = grpo_run.make_config(tmp_path / "out", steps=1, vllm_mode="server", vllm_server_host="127.0.0.1", vllm_server_timeout=1)
    args.use_vllm = True
    trainer = GRPOTrainer(
        model=tiny.save_tiny(tmp_path / "tiny-qwen2", "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=conversational_dataset(),
        processing_class=tokenizer,
    )
    client(trainer).session = FakeSession(tokenizer)
    return trainer


def client(trainer):
    """The trainer's VLLMClient: its own up to TRL 0.27, its VLLMGeneration's from 0.28."""
    return trainer.vllm_client if hasattr(trainer, "vllm_client") else trainer.vllm_generation.vllm_client


@pytest.mark.skipif(not IN_CELL, reason="TRL 0.26.0 / 0.28.0 with vLLM installed only")
def test_unpatched_server_mode_chat_raises(tmp_path, server_mode, unpatched):
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    with unpatched(TEMPLATE_ID):  # it turns 0.26.0's tools=[] into None at __init__, hiding this bug too
        trainer = server_trainer(tmp_path)
    with unpatched(PATCH_ID):
        assert trainer.tools == []
        with pytest.raises(NotImplementedError, match=NO_TOOLS):
            trainer.train()
    assert client(trainer).session.requests == []  # raised before any request


@pytest.mark.skipif(not IN_CELL, reason="TRL 0.26.0 / 0.28.0 with vLLM installed only")
def test_patched_server_mode_step_completes(tmp_path, server_mode, unpatched):
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    with unpatched(TEMPLATE_ID):  # this patch alone: TRL's trainer keeps tools=[]
        trainer = server_trainer(tmp_path)
    patched_chat = client(trainer).chat
    calls = []

    def record(*args, **kwargs):  # what TRL's trainer passes, above the patch
        calls.append(kwargs.get("tools", "unset"))
        return patched_chat(*args, **kwargs)

    client(trainer).chat = record
    trainer.tiny_initial_trainable = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    assert calls and all(tools == [] for tools in calls), calls  # TRL 0.26.0 / 0.28.0 still pass []
    # TRL's chat raises on any tools that is not None before it posts: each request it sent is
    # a call that reached it with tools=None
    requests = client(trainer).session.requests
    assert len(requests) == len(calls), requests
    url, body = requests[0]
    assert url.endswith("/chat/") and body["messages"][0][0]["role"] == "user", body
    assert body["n"] == grpo_run.NUM_GENERATIONS, body
    assert server_mode, "no weight sync reached the (fake) server"
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert grpo_run.changed_trainable(trainer), "the policy did not train"
