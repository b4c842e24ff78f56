"""vllm-prompt-special-tokens: TRL 0.19.0 strips special tokens from every vLLM prompt.

Upstream: fixed in 0.19.1 by PRs #3651, commit 7dbf4777b, and #3698, commit ebb08d4f1.

The bug (TRL issue #3644; unsloth#2980; unsloth and unsloth-zoo require ``trl!=0.19.0``): the fix
of ``vllm-prompt-truncation`` (PR #3601) re-decodes the truncated prompt ids for vLLM with
``batch_decode(prompt_ids, skip_special_tokens=True)``. Whenever ``max_prompt_length`` is set (it
is 512 by default) every vLLM prompt loses its chat-template tokens (``<|im_start|>``,
``<|start_header_id|>``...) and BOS, while the loss is computed on the ids that keep them:
"severely mangled" generations, no error.

Where it shows: TRL 0.19.0 with ``use_vllm=True`` and ``max_prompt_length`` set, the 0.19.0.dev0
main-branch builds from b0958c6f8 (PR #3601) on, and the 0.20.0.dev0 builds before PR #3651
reached main (79ec242ae): the window runs up to 0.20.0, and the probe tells 0.19.1 and the
fixed dev builds apart.

Probe: the generation method decodes ``prompt_ids`` with ``skip_special_tokens=True``.

Fix (``trl_compat._helpers.vllm_prompts``): while ``_generate_and_score_completions`` runs, the training ids
of each prompt of the batch are kept (gathered from every process in server mode), and each
decoded text vLLM is handed is replaced by those ids (the in-process engine) or by a text that
tokenises back to them (the server). This changes what vLLM generates: from the prompt with its
special tokens, as the loss sees it.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.19.0 is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed
from trl_compat._helpers import vllm_prompts


def _judge(name, source):
    if "batch_decode(prompt_ids, skip_special_tokens=True" in source:
        return needed(
            f"GRPOTrainer.{name} decodes the truncated prompt ids for vLLM with skip_special_tokens=True: "
            "chat-template tokens and BOS are missing from every vLLM prompt; with the patch vLLM "
            "generates from the training ids, special tokens included, which changes what is generated"
        )
    if "batch_decode(prompt_ids" in source:
        return not_needed(f"GRPOTrainer.{name} keeps special tokens when it decodes the truncated prompt (PR #3651)")
    return not_needed(f"GRPOTrainer.{name} does not re-decode the truncated prompt for vLLM")


probe, apply = vllm_prompts.prompt_patch(vllm_prompts.SPECIAL_TOKENS, _judge)
