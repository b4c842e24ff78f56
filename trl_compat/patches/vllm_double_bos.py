"""vllm-double-bos: vLLM adds the tokenizer's special tokens to a prompt text training tokenised without.

Upstream: 0.24.0's PR #4152, main-branch commit cc578b6b1, made the training ids the ones vLLM ran;
1.0.0's PR #5238 tokenises before vLLM. The fix PR #3856 was closed unmerged.

The bug (TRL issue #3853, open-r1#695: "a significant drop in reward if using vllm compared to
vanilla transformers"): GRPOTrainer applies the chat template as text, which for Llama 3 starts
with the BOS text ``<|begin_of_text|>``, and tokenises it for the loss with
``add_special_tokens=False``: one BOS. vLLM tokenises the same text with its special tokens, and a
BOS-adding tokenizer puts a second BOS in front: vLLM generates after ``[BOS, BOS, ...]``, training
computes the log-probs of those completions after ``[BOS, ...]``. (A BOS-adding tokenizer with a
template or raw text without the BOS text gives the mirror image: a BOS for vLLM, none for training.)

Where it shows: TRL 0.14.0 - 0.23.1 with ``use_vllm=True`` and a tokenizer that adds special tokens to a
text (Llama 2/3, Mistral); Qwen-style tokenizers add none and are not affected. 0.20 - 0.23 send the
same text: colocate ``vllm_inputs = all_prompts_text; self.llm.generate(vllm_inputs, ...)``, server
``vllm_client.generate(prompts=ordered_set_of_prompts, ...)``; the training ids are the last
``max_prompt_length`` ids of ``add_special_tokens=False``, decoded back to that text.

Probe: the generation method (``_generate_and_score_completions`` from 0.16; ``_generate_single_turn``
from 0.24) tokenises with ``add_special_tokens=False`` and hands vLLM the prompt texts; "not needed"
where it trains on the prompt ids vLLM returns (``output.prompt_token_ids``, PR #4152), "undecided"
where no method calling vLLM is found. Whether a tokenizer adds special tokens is known at run time
only: the wrapper compares, per prompt, vLLM's tokenisation with training's and acts only where they differ.

Fix (``trl_compat._helpers.vllm_prompts``): such a prompt reaches vLLM as the training ids (in-process
engine) or as a text whose tokenisation with special tokens gives them (server: the BOS text
stripped). This changes what vLLM generates for those prompts: after one BOS, as training sees it.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.24 is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed
from trl_compat._helpers import vllm_prompts


def _judge(name, source):
    if vllm_prompts.trains_on_vllm_prompt_ids(source):
        return not_needed(f"GRPOTrainer.{name} trains on the prompt ids vLLM ran (TRL PR #4152)")
    if "add_special_tokens=False" not in source:
        return not_needed(f"GRPOTrainer.{name} tokenises prompts with the tokenizer's special tokens, as vLLM does")
    if not vllm_prompts.calls_vllm_with_text(source):
        return not_needed(f"GRPOTrainer.{name} does not hand vLLM the prompt texts")
    return needed(
        f"GRPOTrainer.{name} tokenises prompts with add_special_tokens=False for the loss but hands vLLM "
        "text, which vLLM tokenises with special tokens: a BOS-adding tokenizer whose chat template writes "
        "the BOS text gives vLLM two BOS ids, training one; with the patch such prompts reach vLLM as the "
        "training ids, which changes what is generated for them (prompts both tokenise alike are untouched)"
    )


probe, apply = vllm_prompts.prompt_patch(vllm_prompts.DOUBLE_BOS, _judge)
