"""vllm-serve-raw-logprobs: ``trl vllm-serve`` of TRL 0.23.0 - 0.27.0 builds its engine
(``trl.scripts.vllm_serve.llm_worker``) without ``logprobs_mode``: the server returns RAW log-probs
to the trainer's importance-sampling correction.

* Cells with TRL 0.23 - 0.27 and the stand-in (trl0.23.1, trl0.24.0, trl0.26.0, trl0.26.2): TRL's
  real ``llm_worker`` run in this process against the stand-in, with a fake pipe standing in for the
  server's parent process: it builds ``LLM(...)`` from ``ScriptArguments(model=<tiny dir>)``, says
  "ready", serves one ``generate`` call (``SamplingParams(temperature=0.7, logprobs=0)``, as the
  server's ``/generate/`` sends it) and shuts down. Without the patch the engine is built with the
  default ``raw_logprobs`` and the log-probs it returns are those of the untempered logits; with it,
  ``processed_logprobs``, and they are the tempered ones the trainer compares them with.
* The probe on the real ``trl.scripts.vllm_serve`` of each cell from TRL 0.23 on.

Not covered: the HTTP server and its worker processes (``main`` spawning ``llm_worker`` with
``trl-compat run``'s activation in the child: the mechanism vllm-serve-get-open-port's tests start);
a trainer in server mode reading these log-probs end to end (the client side needs NCCL).
"""

from __future__ import annotations

import importlib

import trl_compat
from trl_compat.patches import vllm_serve_raw_logprobs as patch_module

import pytest
from packaging.version import Version

from versions import installed

PATCH_ID = "vllm-serve-raw-logprobs"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and Version("0.23.0") <= TRL < Version("0.27.1") and VLLM is not None
in_window = pytest.mark.skipif(not IN_WINDOW, reason="TRL 0.23.0 - 0.27.0 with the vLLM stand-in")
TEMPERATURE = 0.7


def _serve_one_generate(tmp_path, monkeypatch):
    """TRL's llm_worker against the stand-in: (the engine it built, the log-probs it returned, the
    prompt + completion ids they belong to)."""
    import torch
    from vllm import SamplingParams
    from vllm.entrypoints.llm import LLM as StandIn

    import tiny

    serve = importlib.import_module("trl.scripts.vllm_serve")
    model = tiny.make_model("qwen2")
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)  # peaked distributions: the temperature matters
    path = tiny.save_tiny(tmp_path / "scaled", model=model)
    for name in ("VLLM_DP_RANK", "VLLM_DP_RANK_LOCAL", "VLLM_DP_SIZE", "VLLM_DP_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)  # llm_worker sets them; restored after the test
    built = []
    init = StandIn.__init__

    def recording_init(self, *args, **kwargs):
        built.append(self)
        init(self, *args, **kwargs)

    monkeypatch.setattr(StandIn, "__init__", recording_init)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=6, logprobs=0, seed=3)
    prompt = tiny.prompt_dataset(1)["prompt"][0]

    class Pipe:  # the parent process's end of the server's pipe
        def __init__(self):
            self.inbox = [{"type": "call", "method": "generate", "kwargs": {"prompts": [prompt], "sampling_params": params}}]
            self.inbox.append({"type": "shutdown"})
            self.sent = []

        def send(self, obj):
            self.sent.append(obj)

        def recv(self):
            return self.inbox.pop(0)

    pipe = Pipe()
    serve.llm_worker(serve.ScriptArguments(model=path, dtype="float32"), 0, 29599, pipe)
    assert pipe.sent[0] == {"status": "ready"} and len(built) == 1
    (output,) = pipe.sent[1]
    completion = output.outputs[0]
    got = torch.tensor([next(iter(lp.values())).logprob for lp in completion.logprobs])
    ids = torch.tensor([output.prompt_token_ids + completion.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(output.prompt_token_ids) - 1 : -1]
    targets = torch.tensor(completion.token_ids)[:, None]
    raw = torch.log_softmax(logits, -1).gather(-1, targets)[:, 0]
    tempered = torch.log_softmax(logits / TEMPERATURE, -1).gather(-1, targets)[:, 0]
    assert (tempered - raw).abs().mean() > 0.05  # the two differ enough to tell apart
    return built[0], got, raw, tempered


@in_window
def test_server_engine_returns_raw_logprobs_without_the_patch(tmp_path, monkeypatch, unpatched):
    importlib.import_module("trl.scripts.vllm_serve")  # the patch's trigger
    with unpatched(PATCH_ID):
        llm, got, raw, tempered = _serve_one_generate(tmp_path, monkeypatch)
    assert "logprobs_mode" not in llm.init_kwargs and llm.logprobs_mode == "raw_logprobs"
    assert (got - raw).abs().max() < 1e-4 and (got - tempered).abs().mean() > 0.05


@in_window
def test_server_engine_returns_tempered_logprobs_with_the_patch(tmp_path, monkeypatch):
    serve = importlib.import_module("trl.scripts.vllm_serve")
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    assert serve.LLM.__module__ == "trl_compat._helpers.vllm_logprobs"
    llm, got, raw, tempered = _serve_one_generate(tmp_path, monkeypatch)
    assert llm.init_kwargs["logprobs_mode"] == "processed_logprobs"
    assert llm.init_kwargs["worker_extension_cls"] == "trl.scripts.vllm_serve.WeightSyncWorkerExtension"  # rest untouched
    assert (got - tempered).abs().max() < 1e-4


@pytest.mark.skipif(TRL is None or VLLM is None or TRL < Version("0.23.0"), reason="TRL >= 0.23 with vLLM (the stand-in)")
def test_probe_on_the_installed_trl():
    verdict = patch_module.probe(importlib.import_module("trl.scripts.vllm_serve"))
    assert verdict.needed is (TRL < Version("0.27.1")), verdict
    if not verdict.needed:
        assert "with a logprobs_mode" in verdict.reason or "no llm_worker" in verdict.reason
