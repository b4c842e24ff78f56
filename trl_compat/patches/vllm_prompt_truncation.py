"""vllm-prompt-truncation: TRL 0.14 - 0.18 generate with vLLM from the untruncated prompt.

Upstream: the fix, PR #3601, commit b0958c6f8, is in 0.19.0.

The bug (TRL issues #3569, #3180; open-r1#672, unsloth#1642): GRPOTrainer keeps the last
``max_prompt_length`` (default 512) ids of each prompt for the loss, the reference log-probs and
the KL, but hands vLLM the untruncated prompt text. Generation runs on the whole prompt while the
loss is computed on its tail: off-policy samples and wrong log-probs, no error. When the whole
prompt is longer than vLLM's ``max_model_len`` (0.18's colocate mode sets it to
``max_prompt_length + max_completion_length``), vLLM rejects it: ``ValueError: The decoder prompt
(length 3353) is longer than the maximum model length of 2560``.

Where it shows: TRL 0.14.0 - 0.18.x with ``use_vllm=True`` (in-process engine, server mode, 0.18's
colocate mode), and the 0.19.0.dev0 main-branch builds before b0958c6f8.

Probe: the method that tokenises the prompts and calls vLLM (``compute_loss`` / ``_prepare_inputs``
/ ``_generate_and_score_completions``) truncates with ``-self.max_prompt_length``, does not
re-decode the truncated ids (``batch_decode(prompt_ids``, the fix) and hands vLLM
``all_prompts_text``.

Fix (``trl_compat._helpers.vllm_prompts``): while that method runs, each prompt text whose training ids were
truncated reaches vLLM as those truncated ids (``{"prompt_token_ids": ...}`` to the in-process
engine; to the server, a text that tokenises back to them). This changes what vLLM generates, for
those prompts only: from the prompt the loss is computed on.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.19 is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import vllm_prompts


def _judge(name, source):
    if "-self.max_prompt_length" not in source:
        return not_needed(f"GRPOTrainer.{name} does not truncate prompts")
    if "batch_decode(prompt_ids" in source:
        return not_needed(f"GRPOTrainer.{name} hands vLLM the truncated prompt, decoded (PR #3601)")
    if not vllm_prompts.calls_vllm_with_text(source):
        return undecided(f"GRPOTrainer.{name} truncates prompts but does not hand vLLM all_prompts_text the way this patch expects")
    return needed(
        f"GRPOTrainer.{name} keeps the last max_prompt_length prompt ids for the loss but hands vLLM "
        "the untruncated prompt text (off-policy generation, or vLLM's 'decoder prompt is longer than "
        "the maximum model length'); with the patch vLLM generates from the truncated ids instead, which "
        "changes what is generated for prompts longer than max_prompt_length"
    )


probe, apply = vllm_prompts.prompt_patch(vllm_prompts.TRUNCATION, _judge)
