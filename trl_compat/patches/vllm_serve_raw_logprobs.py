"""vllm-serve-raw-logprobs: ``trl vllm-serve`` (TRL 0.23.0 - 0.27.0) builds its engine without
``logprobs_mode``, so the log-probs it returns to the trainer's importance-sampling correction are RAW.

Upstream: 0.27.1's PR #4873, commit 54b4f6548; 0a881bcee on main for 0.28.0, adds
``logprobs_mode="processed_logprobs"`` to ``llm_worker``'s ``LLM(...)``.

The bug: the colocate half is ``vllm-is-raw-logprobs`` (TRL issue #4159; fixed for colocate only by
PR #4163 in 0.24.0, whose description says "for server mode the user would have to pass
--logprobs-mode", which ``trl vllm-serve``'s ``ScriptArguments`` has no field for). In server mode,
TRL's default ``vllm_mode`` until 1.0, the trainer computes ``exp(old_per_token_logps -
sampling_per_token_logps)`` with the server's raw (temperature 1) log-probs: with
``temperature != 1`` the ratio is systematically off; with 0.26's default
``vllm_importance_sampling_mode="sequence_mask"`` most sequences exceed the cap and get weight 0
(TRL issue #4772, "ratio explosion"). Silent.
Where it shows: TRL 0.23.0 - 0.27.0 (the IS correction arrived in 0.23.0), ``trl vllm-serve`` run with
trl_compat active (``trl-compat run -- trl vllm-serve ...``: the engine is built in the worker process
``llm_worker`` runs in, which the sitecustomize activation reaches).

How the probe recognises it
    ``trl.scripts.vllm_serve.llm_worker`` builds ``LLM(`` without ``logprobs_mode``; not needed where
    it passes one; undecided where the module has no ``LLM`` class to replace (vLLM not importable).

The fix
    ``LLM`` in ``trl.scripts.vllm_serve``'s namespace (used only by ``llm_worker``) becomes a subclass
    whose constructor adds ``logprobs_mode="processed_logprobs"`` when the caller passed none and the
    installed vLLM has the field (>= 0.10.0); on vLLM < 0.10.2 it logs once that the temperature may
    not be in them. Shared with ``vllm-is-raw-logprobs`` (``trl_compat._helpers.vllm_logprobs``).
    A separate id because the registry takes one trigger module per patch and this one runs in the
    server process, not the trainer's.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.27.1 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import vllm_logprobs
from trl_compat._helpers.source import code

PATCH_ID = "vllm-serve-raw-logprobs"


def probe(module):
    worker = getattr(module, "llm_worker", None)
    if worker is None:
        return not_needed("trl.scripts.vllm_serve has no llm_worker (TRL 1.11 on runs vLLM's own server): no vllm.LLM of TRL's")
    source = code(worker)
    if "LLM(" not in source:
        return undecided("trl.scripts.vllm_serve.llm_worker builds no vllm.LLM that could be read")
    if "logprobs_mode" in source:
        return not_needed("trl vllm-serve's llm_worker builds its vllm.LLM with a logprobs_mode (TRL PR #4873)")
    if not isinstance(getattr(module, "LLM", None), type):
        return undecided("llm_worker builds LLM(...) without logprobs_mode, but trl.scripts.vllm_serve has no vllm.LLM class")
    return needed(
        "trl vllm-serve's llm_worker builds its vllm.LLM without logprobs_mode: the server returns raw (temperature 1) "
        "log-probs to the trainer's importance-sampling correction; with the patch it is built with "
        "logprobs_mode='processed_logprobs'"
    )


def apply(module, patcher):
    vllm_logprobs.replace_llm(module, patcher, PATCH_ID)
