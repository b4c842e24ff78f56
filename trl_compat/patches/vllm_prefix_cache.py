"""vllm-prefix-cache: TRL 0.15.x keeps vLLM's prefix cache across weight syncs.

Main-branch builds: 0.16.0.dev0 builds from before the vLLM server mode, PR #3094 have the bug too.

The bug (TRL issue #3024): GRPOTrainer 0.15.0 - 0.15.2 builds its in-process ``vllm.LLM`` with
``enable_prefix_caching=True`` and, after ``_move_model_to_vllm`` loads new weights, never
resets that cache. vLLM keys cached KV blocks by prompt content only, so every prompt prefix
seen before (a shared system prompt, a chat template's header, a prompt of an earlier epoch) is
served KV computed by the weights of the step that first saw it, possibly step 0. Completions
are then sampled from neither the old nor the current policy: silently off-policy, no error.
TRL 0.16 dropped the in-process engine and resets the server's cache after every sync
(``vllm_client.reset_prefix_cache()``); 0.18's colocate mode calls ``self.llm.reset_prefix_cache()``.

Where it shows: TRL 0.15.0, 0.15.1, 0.15.2 with ``use_vllm=True`` (0.14.0 does not turn prefix
caching on), the main-branch builds between, and the 0.16.0.dev0 builds from ``ffcb9f4ae``
(version bump) up to PR #3094 (``f713f614e``, the first that resets the cache; the cache was
``vllm_enable_prefix_caching``, default True, from PR #2900). ``vllm.LLM.reset_prefix_cache``
exists from vLLM 0.7.0 on; TRL 0.15 requires 0.7.1 or newer.

Probe: the source of ``trl.trainer.grpo_trainer`` builds an engine with
``enable_prefix_caching``, never calls ``reset_prefix_cache``, and GRPOTrainer defines
``_move_model_to_vllm``. Early 0.15.0.dev0 builds (e.g. ``1f344c937``) have the bug but load
the weights inline in ``compute_loss``: "undecided", with a warning, nothing applied. The
module's file is read, not the method, so another patch wrapping ``_move_model_to_vllm`` first
(``vllm-merged-weights``) cannot hide the bug.

Fix: after TRL's ``_move_model_to_vllm`` returns, the main process calls
``self.llm.reset_prefix_cache()``: prompts that repeat within one step still share their cached
blocks (the point of the cache in GRPO), nothing computed by older weights is reused. If vLLM
reports that it could not reset (requests still holding blocks), a warning says so.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.15.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import functools
import logging

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

log = logging.getLogger(__name__)


def probe(module):
    source = code(module)  # comments and docstrings that mention the names do not count
    if "reset_prefix_cache" in source:
        return not_needed("GRPOTrainer resets vLLM's prefix cache itself")
    if "enable_prefix_caching" not in source:
        return not_needed("GRPOTrainer does not turn on vLLM's prefix caching")
    if "_move_model_to_vllm" not in vars(module.GRPOTrainer):
        # early 0.15.0.dev0 builds: caching on, weights loaded inline in compute_loss
        return undecided(
            "vLLM's prefix cache is on and never reset, but this build loads weights inline "
            "(no _move_model_to_vllm) where this patch cannot hook in"
        )
    return needed(
        "vLLM is built with enable_prefix_caching and its cache is never reset after "
        "_move_model_to_vllm: prompt prefixes keep KV from older weights"
    )


def _reset_prefix_cache(trainer) -> None:
    llm = getattr(trainer, "llm", None)  # only the main process holds the engine
    if llm is None:
        return
    reset = getattr(llm, "reset_prefix_cache", None)
    if reset is None:
        log.warning(
            "trl_compat: vllm-prefix-cache: this vLLM has no LLM.reset_prefix_cache (added in "
            "vLLM 0.7.0); prompt prefixes cached before this weight sync stay in use"
        )
        return
    if reset() is False:
        log.warning(
            "trl_compat: vllm-prefix-cache: vLLM could not reset its prefix cache (blocks still "
            "in use); prompt prefixes cached before this weight sync may be reused"
        )


def _wrap_move(move):
    @functools.wraps(move)
    def _move_model_to_vllm(self, *args, **kwargs):
        result = move(self, *args, **kwargs)
        _reset_prefix_cache(self)
        return result

    return _move_model_to_vllm


def apply(module, patcher):
    patcher.wrap(module.GRPOTrainer, "_move_model_to_vllm", _wrap_move)
