"""server-logprobs-mode-check: TRL 1.11.0 - 1.15.x never ask a vLLM server for its ``--logprobs-mode``;
the importance sampling correction then divides by raw log-probs. TRL 1.16.0 asks and warns.

* Every cell with TRL: the probe on the cell's TRL ("needed" on 1.11.0 - 1.15.x only).
* Every cell: the probe on code written here (a trainer without ``VLLMGeneration``, 1.11's, 1.16's); the
  server's answer read as 1.16.0 reads it (the mode; a 404, an answer without the field and a failed
  request give the reason, never an error).
* TRL 1.11.0 - 1.15.x with the vLLM stand-in (the trl1.12.0-tf5.16.1 cell): a real ``GRPOTrainer`` built in
  server mode, TRL's real ``VLLMClient`` on a fake HTTP session (``fake_http.CompletionServer``) whose
  ``/server_info`` reports ``raw_logprobs``: unpatched, the server is never asked and nothing is logged;
  patched, ``/server_info`` is asked once and TRL 1.16.0's warning names ``raw_logprobs``. A server on
  ``processed_logprobs`` gets no warning; with ``vllm_importance_sampling_correction=False`` the server is
  not asked.
"""

from __future__ import annotations

import logging

from trl_compat.patches import server_logprobs_mode_check as patch_module

import pytest
from packaging.version import Version

import fake_http
from versions import installed

PID = "server-logprobs-mode-check"
TRL = installed("trl")
BUGGY = TRL is not None and Version("1.11.0") <= TRL < Version("1.16.0")
LOGGER = "trl_compat.patches.server_logprobs_mode_check"


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = patch_module.probe(module)
    assert verdict.needed is BUGGY, verdict


def _module(init, client_source):
    """A trainer module whose GRPOTrainer.__init__ is ``init``; the client module's source faked."""

    class GRPOTrainer:
        pass

    GRPOTrainer.__init__ = init

    class Module:
        pass

    Module.GRPOTrainer = GRPOTrainer
    return Module, client_source


def _init_110(self, args):
    self.vllm_generation = VLLMGeneration(mode=args.vllm_mode)  # noqa: F821 - read, never run


def _init_116(self, args):
    self.vllm_generation = VLLMGeneration(mode=args.vllm_mode)  # noqa: F821 - read, never run
    mode = self.vllm_generation.vllm_client.get_server_info()["model_config"]["logprobs_mode"]
    if mode != "processed_logprobs":
        pass


def _init_027(self, args):
    self.vllm_client = VLLMClient(args.vllm_server_host)  # noqa: F821 - read, never run


OPENAI_CLIENT = 'def generate(self, payload): return self._post(f"{self.base_url}/v1/completions", json=payload)'
TRL_SERVE_CLIENT = 'def generate(self, payload): return self._post(f"{self.base_url}/generate/", json=payload)'


@pytest.mark.parametrize(
    ("init", "client", "needed"),
    [
        (_init_027, OPENAI_CLIENT, False),  # no VLLMGeneration (TRL < 0.28)
        (_init_110, TRL_SERVE_CLIENT, False),  # 0.28 - 1.10: trl vllm-serve chooses the mode
        (_init_110, OPENAI_CLIENT, True),  # 1.11 - 1.15
        (_init_116, OPENAI_CLIENT, False),  # 1.16 reads it
    ],
)
def test_probe_on_code_written_here(monkeypatch, init, client, needed):
    from trl_compat._helpers import source

    module, client_source = _module(init, client)
    monkeypatch.setattr(patch_module, "module_code", lambda name: source.Code(source.normalise(client_source)))
    assert patch_module.probe(module).needed is needed


class _Client:
    base_url = "http://server:8000"

    def __init__(self, session):
        self.session = session


class _Raising:
    def get(self, url, **kwargs):
        raise ConnectionError("refused")


def test_the_servers_answer_is_read_as_trl_116_reads_it():
    server = fake_http.CompletionServer(logprobs_mode="raw_logprobs")
    assert patch_module.server_logprobs_mode(_Client(server)) == ("raw_logprobs", None)
    assert server.got == ["http://server:8000/server_info"]

    mode, why = patch_module.server_logprobs_mode(_Client(fake_http.CompletionServer()))  # no such field
    assert mode is None and "no vllm_config.model_config.logprobs_mode" in why

    mode, why = patch_module.server_logprobs_mode(_Client(_Raising()))
    assert mode is None and "ConnectionError: refused" in why


def test_a_404_names_the_dev_mode():
    pytest.importorskip("requests")

    class NotFound:
        def get(self, url, **kwargs):
            return fake_http.EmptyResponse(status_code=404)

    mode, why = patch_module.server_logprobs_mode(_Client(NotFound()))
    assert mode is None and "answered 404" in why and "VLLM_SERVER_DEV_MODE=1" in why


def _build_or_skip():
    fake_http.server_mode_or_skip(BUGGY, "1.11.0 - 1.15.x (the trl1.12.0-tf5.16.1 cell)")


_server_trainer = fake_http.server_trainer


def _warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]


def test_bug_without_the_patch_the_server_is_never_asked(tmp_path, monkeypatch, caplog, unpatched):
    _build_or_skip()
    import trl_compat

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    server = fake_http.CompletionServer(logprobs_mode="raw_logprobs")
    with unpatched(PID), caplog.at_level(logging.WARNING):
        trainer = _server_trainer(tmp_path, monkeypatch, server)
    assert trainer.vllm_importance_sampling_correction is True  # TRL's default: the correction is on
    assert not [url for url in server.got if url.endswith("/server_info")]
    assert not [r for r in caplog.records if r.getMessage().startswith("The vLLM server runs with")]
    assert _warnings(caplog) == []


def test_patched_a_raw_server_is_named(tmp_path, monkeypatch, caplog):
    _build_or_skip()
    server = fake_http.CompletionServer(logprobs_mode="raw_logprobs")
    with caplog.at_level(logging.WARNING):
        _server_trainer(tmp_path, monkeypatch, server)
    assert [url for url in server.got if url.endswith("/server_info")] == ["http://127.0.0.1:8000/server_info"]
    assert _warnings(caplog) == [
        "The vLLM server runs with `--logprobs-mode raw_logprobs`, which biases the importance sampling correction. "
        "Restart it with `--logprobs-mode processed_logprobs`, or set `vllm_importance_sampling_correction=False`."
    ]


def test_patched_a_processed_server_or_no_correction_is_quiet(tmp_path, monkeypatch, caplog):
    _build_or_skip()
    processed = fake_http.CompletionServer(logprobs_mode="processed_logprobs")
    with caplog.at_level(logging.WARNING):
        _server_trainer(tmp_path / "processed", monkeypatch, processed)
    assert len([url for url in processed.got if url.endswith("/server_info")]) == 1
    assert _warnings(caplog) == []

    raw = fake_http.CompletionServer(logprobs_mode="raw_logprobs")
    with caplog.at_level(logging.WARNING):
        _server_trainer(tmp_path / "off", monkeypatch, raw, vllm_importance_sampling_correction=False)
    assert not [url for url in raw.got if url.endswith("/server_info")]
    assert _warnings(caplog) == []
