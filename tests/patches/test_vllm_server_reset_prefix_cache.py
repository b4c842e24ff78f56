"""vllm-server-reset-prefix-cache: TRL 1.11.0 - 1.14.0 parse vLLM's answer to ``POST /reset_prefix_cache``
as JSON; vLLM < 0.26 answers it with an empty body.

* Every cell with TRL >= 0.28 (``trl/generation/vllm_client.py``): the probe on the cell's TRL ("needed" on
  1.11.0 - 1.14.0 only).
* Every cell: the probe on code written here in the shapes of 1.10 (posts itself), 1.11 - 1.14.0 (through
  ``_post``), 1.14.1 (both, by vLLM version); the wrapper on a client written here: an empty answer and
  ``{"success": true}`` end the call, a 500 raises TRL's ``Request failed``, a call with arguments goes to
  the original.
* TRL 1.11.0 - 1.14.0 with the vLLM stand-in (the trl1.12.0-tf5.16.1 cell): one real GRPO step in server
  mode, TRL's real ``VLLMClient`` on a fake HTTP session (``fake_http.CompletionServer``) whose
  ``/reset_prefix_cache`` answers as vLLM 0.25.1's server does (200, no body; a real ``requests.Response``).
  Unpatched, ``train()`` raises ``requests.exceptions.JSONDecodeError`` after the reset was posted; patched,
  the step trains (finite loss) and the reset is posted once per weight sync; against vLLM 0.26's answer
  too; a 500 answer raises TRL's ``Request failed: 500``.
"""

from __future__ import annotations

import importlib.util

from trl_compat.patches import vllm_server_reset_prefix_cache as patch_module

import pytest
from packaging.version import Version

import fake_http
from versions import installed

PID = "vllm-server-reset-prefix-cache"
TRL = installed("trl")
BUGGY = TRL is not None and Version("1.11.0") <= TRL < Version("1.14.1")
BASE = "http://server:8000"


def _client_module_or_skip():
    if TRL is None or TRL < Version("0.28.0"):
        pytest.skip(f"TRL {TRL}: no trl/generation/vllm_client.py (from 0.28)")
    if importlib.util.find_spec("requests") is None:
        pytest.skip("TRL's client module needs requests")
    import trl.generation.vllm_client as client_module

    return client_module


def test_probe_on_the_cells_trl():
    client_module = _client_module_or_skip()
    verdict = patch_module.probe(client_module)
    assert verdict.needed is BUGGY, verdict
    if BUGGY:
        assert "empty body" in verdict.reason


class _Client:
    base_url = BASE

    def __init__(self, session):
        self.session = session

    def _post(self, url, **kwargs):
        response = self.session.post(url, **kwargs)
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")
        return response.json()


class Client110(_Client):
    def reset_prefix_cache(self):
        url = f"{self.base_url}/reset_prefix_cache/"
        response = self.session.post(url)
        if response.status_code != 200:
            raise Exception(f"Request failed: {response.status_code}, {response.text}")


class Client111(_Client):
    def reset_prefix_cache(self):
        self._post(f"{self.base_url}/reset_prefix_cache")


class Client1141(_Client):
    has_success = False

    def reset_prefix_cache(self):
        if self.has_success:
            self._post(f"{self.base_url}/reset_prefix_cache")
        else:
            response = self.session.post(f"{self.base_url}/reset_prefix_cache")
            if response.status_code != 200:
                raise Exception(f"Request failed: {response.status_code}, {response.text}")


@pytest.mark.parametrize(("client", "needed"), [(Client110, False), (Client111, True), (Client1141, False)])
def test_probe_on_code_written_here(client, needed):
    class Module:
        VLLMClient = client

    assert patch_module.probe(Module).needed is needed


def test_probe_not_needed_where_post_does_not_parse():
    class Quiet(Client111):
        def _post(self, url, **kwargs):
            return self.session.post(url, **kwargs)

    class Module:
        VLLMClient = Quiet

    assert patch_module.probe(Module).needed is False


def _patched_reset(server):
    class Client(Client111):
        pass

    Client.reset_prefix_cache = patch_module.empty_answer_allowed(Client111.reset_prefix_cache)
    return Client(server)


def test_wrapper_takes_both_answers_and_raises_on_an_error():
    pytest.importorskip("requests")
    import requests

    empty = fake_http.CompletionServer(reset_answer=fake_http.EmptyResponse())
    with pytest.raises(requests.exceptions.JSONDecodeError):
        Client111(empty).reset_prefix_cache()  # TRL 1.11 - 1.14.0 on vLLM 0.25's answer
    assert empty.posted == [f"{BASE}/reset_prefix_cache"]  # the server got the reset before the error
    assert _patched_reset(empty).reset_prefix_cache() is None
    assert empty.posted == [f"{BASE}/reset_prefix_cache"] * 2

    success = fake_http.CompletionServer()  # vLLM >= 0.26: {"success": true}
    assert _patched_reset(success).reset_prefix_cache() is None
    assert success.posted == [f"{BASE}/reset_prefix_cache"]

    failing = fake_http.CompletionServer(reset_answer=fake_http.EmptyResponse(status_code=500))
    with pytest.raises(Exception, match="Request failed: 500"):
        _patched_reset(failing).reset_prefix_cache()


def test_wrapper_hands_a_call_with_arguments_to_the_original():
    seen = []

    def reset_prefix_cache(self, *args, **kwargs):
        seen.append((args, kwargs))
        return "original"

    wrapped = patch_module.empty_answer_allowed(reset_prefix_cache)
    assert wrapped(object(), True, reset_external=True) == "original"
    assert seen == [((True,), {"reset_external": True})]


def _server_mode_or_skip():
    fake_http.server_mode_or_skip(BUGGY, "1.11.0 - 1.14.0 (the trl1.12.0-tf5.16.1 cell)")


def _server_step(tmp_path, monkeypatch, server):
    """One GRPO step in server mode on ``server``, its resets posted to it; returns the trainer after ``train()``."""
    trainer = fake_http.server_trainer(tmp_path, monkeypatch, server, reset_prefix_cache=True, max_completion_length=8)
    trainer.train()
    return trainer


def _resets(server):
    return [url for url in server.posted if url.endswith("/reset_prefix_cache")]


def test_bug_without_the_patch_the_first_sync_dies(tmp_path, monkeypatch, unpatched):
    _server_mode_or_skip()
    import trl_compat

    import requests

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    server = fake_http.CompletionServer(reset_answer=fake_http.EmptyResponse())  # vLLM 0.25.1's answer
    with unpatched(PID), pytest.raises(requests.exceptions.JSONDecodeError):
        _server_step(tmp_path, monkeypatch, server)
    assert len(_resets(server)) == 1  # the reset reached the server; its empty answer killed the step


@pytest.mark.parametrize("answer", ["vLLM 0.25", "vLLM 0.26"])
def test_patched_the_step_trains_on_either_answer(tmp_path, monkeypatch, answer):
    _server_mode_or_skip()
    import trl_compat

    import grpo_run

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    reset_answer = fake_http.EmptyResponse() if answer == "vLLM 0.25" else fake_http.JsonResponse({"success": True})
    server = fake_http.CompletionServer(reset_answer=reset_answer)
    trainer = _server_step(tmp_path, monkeypatch, server)
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert server.requests  # the step generated on the server
    assert len(_resets(server)) >= 1


def test_patched_an_error_answer_is_trls_error(tmp_path, monkeypatch):
    _server_mode_or_skip()
    server = fake_http.CompletionServer(reset_answer=fake_http.EmptyResponse(status_code=500))
    with pytest.raises(Exception, match="Request failed: 500"):
        _server_step(tmp_path, monkeypatch, server)
