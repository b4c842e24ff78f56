"""server-logprobs-mode-check: TRL 1.11.0 - 1.15.x, server mode with the vLLM importance sampling
correction (the default): a vLLM server started without ``--logprobs-mode processed_logprobs``
returns raw log-probs (before temperature and logit processing), and the correction divides by
them: silently biased.

The bug: from TRL 1.11 server mode talks to vLLM's own server (``vllm serve``), whose log-probs mode
is the server's command-line choice; vLLM's default is ``raw_logprobs``. TRL's docs of
``VLLMClient`` show the flag, and colocate mode sets ``logprobs_mode="processed_logprobs"`` itself,
but nothing checks a server: with ``vllm_importance_sampling_correction=True`` (the default) and a
server on raw log-probs (or temperature 1 with top-k/top-p processing...), the ratio
``exp(old_per_token_logps - sampling_per_token_logps)`` compares the trainer's processed
log-probs with vLLM's raw ones, and every step's correction is off. TRL 1.16.0 asks the server
(``GET /server_info?config_format=json``, ``vllm_config.model_config.logprobs_mode``) when the
trainer is built and warns when the mode is not ``processed_logprobs`` (wheel diff 1.15.0 ->
1.16.0). Where it shows: TRL 1.11.0 - 1.15.x in server mode.

Probe: ``GRPOTrainer.__init__`` builds a ``VLLMGeneration`` (0.28+), whose server-mode client posts to
vLLM's own ``/v1/completions`` (1.11+; up to 1.10 it talks to ``trl vllm-serve``, which chooses the
mode itself), and ``__init__``'s source never reads ``logprobs_mode``: "needed"; 1.16.0's reads it:
"not needed".

Fix: after TRL's ``__init__``, on the main process of a server-mode run with the correction on, the
server is asked as TRL 1.16.0 asks it (the client's own session, so its retries and base URL), and
TRL 1.16.0's warning is logged when the mode is not ``processed_logprobs``. A server that does not
answer it (no ``VLLM_SERVER_DEV_MODE=1``, another shape, an error) gets one warning that the mode
could not be checked; the run goes on, as it would have without the check.

Run time: a check that only logs: its own errors fall back to no check (``guarded``); the server's
answers never raise.

Delete when: trl_compat no longer supports TRL 1.11.0 - 1.15.x (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import logging

from trl_compat._engine import guarded, needed, not_needed
from trl_compat._helpers.source import code, module_code
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "server-logprobs-mode-check"
PROCESSED = "processed_logprobs"
# the client of vLLM's own server (TRL 1.11+) posts generation requests to its OpenAI endpoint
VLLM_SERVER_COMPLETIONS = 'self._post(f"{self.base_url}/v1/completions",'
log = logging.getLogger(__name__)


def probe(module):
    init = code(module.GRPOTrainer.__init__)
    if "VLLMGeneration (" not in init:
        return not_needed("GRPOTrainer.__init__ builds no VLLMGeneration (TRL < 0.28)")
    if VLLM_SERVER_COMPLETIONS not in module_code("trl.generation.vllm_client"):
        return not_needed("the server-mode client talks to trl vllm-serve, which sets the log-probs mode itself")
    if "logprobs_mode" in init:
        return not_needed("GRPOTrainer.__init__ reads the server's logprobs_mode")
    return needed(
        "GRPOTrainer.__init__ never asks a vLLM server for its --logprobs-mode: the importance sampling correction "
        "takes raw log-probs from a server not started with processed_logprobs"
    )


def server_logprobs_mode(client):
    """``(mode, None)`` as the server reports it, or ``(None, why)`` when it cannot be read."""
    try:
        response = client.session.get(f"{client.base_url}/server_info", params={"config_format": "json"})
    except Exception as error:  # noqa: BLE001 - a server that does not answer: no check, as unpatched
        return None, f"GET /server_info failed: {type(error).__name__}: {error}"
    if response.status_code != 200:
        return None, f"GET /server_info answered {response.status_code} (the server needs VLLM_SERVER_DEV_MODE=1)"
    try:
        return response.json()["vllm_config"]["model_config"]["logprobs_mode"], None
    except (ValueError, KeyError, TypeError) as error:
        return None, f"GET /server_info has no vllm_config.model_config.logprobs_mode ({type(error).__name__}: {error})"


def check_server(trainer, arguments):
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_mode", None) == "server"):
        return
    if not getattr(trainer, "vllm_importance_sampling_correction", False) or not trainer.accelerator.is_main_process:
        return
    with guarded(PATCH_ID, "asking the vLLM server for its --logprobs-mode", "no check"):
        mode, why = server_logprobs_mode(trainer.vllm_generation.vllm_client)
        if why is not None:
            log.warning(
                "trl_compat: could not check the vLLM server's --logprobs-mode (%s); the importance sampling "
                "correction needs `--logprobs-mode %s`",
                why,
                PROCESSED,
            )
        elif mode != PROCESSED:
            log.warning(
                "The vLLM server runs with `--logprobs-mode %s`, which biases the importance sampling correction. "
                "Restart it with `--logprobs-mode %s`, or set `vllm_importance_sampling_correction=False`.",
                mode,
                PROCESSED,
            )


apply = around_init(after=check_server)
