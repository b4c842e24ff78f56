"""The one stand-in for a server's HTTP answer that tests hand TRL's ``VLLMClient`` (through its
``session``): the fake servers of the server-mode tests answer every request with a ``JsonResponse``."""


class JsonResponse:
    """A 200 answer carrying ``body``, as ``requests.Response`` shows it to TRL's client."""

    status_code = 200

    def __init__(self, body):
        self._body = body
        self.text = str(body)

    def json(self):
        return self._body


class RecordingSession:
    """The server's HTTP side: every request answered 200."""

    def post(self, url, **kwargs):
        return JsonResponse({"success": True})


def packed_server_client(monkeypatch, base_url="http://server:8000"):
    """TRL >= 1.11's real ``VLLMClient`` without a server; its weight-transfer group the stand-in's
    recorder (``client.communicator.sent``: one list of ``(name, tensor)`` per packed broadcast)."""
    from trl.generation.vllm_client import VLLMClient
    from vllm.distributed.weight_transfer._recorder import TrainerGroup

    monkeypatch.setattr("atexit.register", lambda function: None)
    client = VLLMClient.__new__(VLLMClient)  # __init__ would wait for a server
    client.base_url, client.session, client._updating_weights = base_url, RecordingSession(), False
    client.communicator = TrainerGroup({})
    return client


class EmptyResponse:
    """A 200 answer without a body, as vLLM < 0.26 answers ``POST /reset_prefix_cache``: a real
    ``requests.Response``, so that ``json()`` raises what it raises for TRL."""

    def __new__(cls, status_code=200):
        import requests

        response = requests.models.Response()
        response.status_code, response._content, response.encoding = status_code, b"", "utf-8"
        return response


class CompletionServer:
    """A vLLM server as TRL 1.x's client sees it (``trl vllm-serve``'s /generate/ up to 1.10, vLLM's own
    /v1/completions from 1.11): token-id prompts in, ``n`` completions of ``LENGTH`` ids per prompt out,
    each completion new (a counter), and which history each was sampled for. ``reset_answer``: what
    ``POST /reset_prefix_cache`` gets (vLLM >= 0.26's ``{"success": true}`` unless told);
    ``logprobs_mode``: the ``--logprobs-mode`` ``GET /server_info`` reports (None: an answer without it)."""

    FIRST_ID = 40  # completion ids: plain vocabulary words of the tiny tokenizers, never EOS or pad
    LENGTH = 3  # tokens per completion

    def __init__(self, reset_answer=None, logprobs_mode=None):
        self.logprobs_mode = logprobs_mode
        self.got = []  # every URL asked for (GET), in order
        self.requests = []  # (prompts, n) of each generation request
        self.sampled_for = {}  # completion ids -> the prompt they were sampled for
        self.posted = []  # every URL posted to, in order
        self.reset_answer = reset_answer if reset_answer is not None else JsonResponse({"success": True})

    def _sample(self, prompts, n):
        self.requests.append((prompts, n))
        completions = []
        for prompt in prompts:
            for _ in range(n):
                start = self.FIRST_ID + self.LENGTH * len(self.sampled_for)
                ids = list(range(start, start + self.LENGTH))
                self.sampled_for[tuple(ids)] = tuple(prompt)
                completions.append((prompt, ids))
        return completions

    def post(self, url, json=None, **kwargs):
        self.posted.append(url)
        if url.endswith("/generate/"):
            completions = self._sample([list(p) for p in json["prompts"]], json["n"])
            body = {
                "prompt_ids": [list(p) for p in json["prompts"]],
                "completion_ids": [ids for _, ids in completions],
                "logprobs": [[[-1.0]] * self.LENGTH for _ in completions],
                "logprob_token_ids": [[[token] for token in ids] for _, ids in completions],
            }
            return JsonResponse(body)
        if url.endswith("/v1/completions"):  # prompt-major choices, tokens as "token_id:<id>"
            completions = self._sample([list(p) for p in json["prompt"]], json["n"])
            choices = [
                {
                    "prompt_token_ids": prompt,
                    "token_ids": ids,
                    "logprobs": {
                        "tokens": [f"token_id:{token}" for token in ids],
                        "token_logprobs": [-1.0] * self.LENGTH,
                        "top_logprobs": [None] * self.LENGTH,
                    },
                }
                for prompt, ids in completions
            ]
            return JsonResponse({"choices": choices})
        if url.endswith("/reset_prefix_cache"):
            return self.reset_answer
        return JsonResponse({})

    def get(self, url, **kwargs):
        self.got.append(url)
        if url.endswith("/server_info") and self.logprobs_mode is not None:  # vLLM's, with config_format=json
            return JsonResponse({"vllm_config": {"model_config": {"logprobs_mode": self.logprobs_mode}}})
        if url.endswith("/v1/models"):  # TRL 1.11+ asks for the served model's name when the client is built
            return JsonResponse({"data": [{"id": "tiny"}]})
        return JsonResponse({})

    def mount(self, prefix, adapter):
        pass


def serve(monkeypatch, server, reset_prefix_cache=False):
    """TRL 1.x's real ``VLLMClient`` on ``server`` (its HTTP session from the start: TRL 1.11+ reads the
    model name in ``__init__``), without a health check, an NCCL group or a weight transfer; its
    ``reset_prefix_cache`` a no-op unless ``reset_prefix_cache`` (then it posts to ``server``)."""
    import torch
    import trl.generation.vllm_client as client_module
    from trl.generation.vllm_client import VLLMClient

    monkeypatch.setattr(client_module.requests, "Session", lambda: server)
    monkeypatch.setattr(VLLMClient, "check_server", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMClient, "init_communicator", lambda self, *a, **k: None)
    monkeypatch.setattr(VLLMClient, "update_named_param", lambda self, name, weights: None)
    monkeypatch.setattr(VLLMClient, "update_named_params", lambda self, metadata, params: list(params), raising=False)
    if not reset_prefix_cache:
        monkeypatch.setattr(VLLMClient, "reset_prefix_cache", lambda self: None)
    monkeypatch.setattr(VLLMClient, "close_communicator", lambda self: None, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    return server


def server_mode_or_skip(in_window: bool, window: str):
    """Skip a server-mode trainer test outside its TRL ``window`` (``in_window`` False) or where TRL's
    server mode cannot start here (no torch/transformers/requests, no importable vllm)."""
    import importlib.util

    import pytest

    if not in_window:
        pytest.skip(f"the server-mode trainer runs on TRL {window}")
    if any(importlib.util.find_spec(m) is None for m in ("torch", "transformers", "requests")):
        pytest.skip("needs torch, transformers and requests")
    import grpo_run

    if not grpo_run.standin_vllm_installed():
        pytest.skip("TRL's server mode needs an importable vllm (the stand-in)")


def server_trainer(tmp_path, monkeypatch, server, reset_prefix_cache=False, **config):
    """A one-step GRPOTrainer in server mode whose real ``VLLMClient`` talks to ``server`` (``serve``)."""
    import grpo_run

    serve(monkeypatch, server, reset_prefix_cache=reset_prefix_cache)
    trainer = grpo_run.make_trainer(
        tmp_path, steps=1, use_vllm="server", vllm_server_host="127.0.0.1", vllm_server_timeout=1, **config
    )
    assert trainer.vllm_generation.vllm_client.session is server
    return trainer
