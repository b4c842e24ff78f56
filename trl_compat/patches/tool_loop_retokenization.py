"""tool-loop-retokenization: TRL 0.26.0 - 0.29.0 with ``tools=[...]`` score re-tokenised completions.

Upstream: the fix is the token-in/token-out series cherry-picked into 0.29.1; on main, #5242 is
ebdfe826f, 2026-03-19, in 1.0.0.

Status: always "undecided" where it is reached: trl_compat does NOT fix this bug in place. Use TRL
0.29.1 (or later) for tool calling.

The bug (issues #5224, by a maintainer, and #5144): multi-turn tool calling arrived with PR #4300
(main commit ca21dd94c, 2025-12-08, TRL 0.26.0). ``GRPOTrainer._tool_call_loop`` parses the sampled
completion into a message (``parse_response``), appends it and the tool's result to the
conversation, and re-tokenises prompt + completion + tool result with ``apply_chat_template``. The
next turn, ``completion_ids`` and the ids the loss scores are these re-tokenised ids, not the ids
the model sampled: BPE decode/encode is not a bijection, and the chat template renders the parsed
message in its own way (whitespace, think blocks, the tool call's JSON re-serialised). Two symptoms:

* silent: the loss (and the importance-sampling ratio against vLLM's log-probs, which stay the
  sampled tokens') scores ids never sampled, and ``tool_mask`` is computed as if the completion kept
  its sampled length (``tool_length = len(pct) - len(prompt) - len(sampled completion)``), so when the
  lengths differ the boundary between model tokens (mask 1) and tool-result tokens (mask 0) is
  shifted: tool-result tokens trained as the model's, or model tokens dropped;
* crash: when the re-tokenised completion is SHORTER than the sampled one by more than the tool
  result's length, ``tool_length`` is negative, ``[0] * tool_length`` is empty, and ``tool_mask``
  (and the log-probs) end up longer than ``completion_ids``: ``RuntimeError: The size of tensor a
  (...) must match the size of tensor b (...) at non-singleton dimension 1`` in ``_compute_loss``
  (#5144: Qwen3-32B, transformers 5.0.0).

Fix upstream: the token-in/token-out series #5225, #5227, #5232, #5238, #5239, #5240 and #5242 (the
0.29.1 branch's 3a5b99bdd: ``prompt_ids + completion_ids + _get_tool_suffix_ids(tool messages)``,
the sampled ids kept, only the tool suffix tokenised). It rewrites ``_generate_single_turn`` (it
returns no prompt ids any more, prompts are tokenised before generation on every backend), the vLLM
client and server (raw token ids), ``_generate`` and ``_tool_call_loop``.

Why undecided, not a patch:

* The real fix is that series. Carrying it in place means replacing ``_generate_single_turn``,
  ``_generate`` and ``_tool_call_loop`` of four releases (0.26.x, 0.27.x, 0.28.0, 0.29.0 differ:
  async tools, ``vllm_generation``, ``env_mask``, rollout functions) and TRL's vLLM client/server:
  a fork of the upstream series, not a patch.
* The crash alone has a small fix, proposed twice and closed unmerged (PR #5145; PR #5247: when
  ``tool_length < 0``, cut the mask's tail before appending the post-tool part). It restores equal
  lengths, not a right mask: the ids are still re-tokenised, and the mask boundary is still shifted
  wherever the lengths differ. It would turn the one loud sign of the silent bug into silent
  training on a misaligned mask. From outside the loop it cannot even be exact: ``tool_mask`` is a
  local list, so a wrapper sees only the final lists, not where each round's post-tool part begins.
* Tool calling in these releases needs transformers >= 5 (``GRPOTrainer(tools=...)`` raises
  ``ImportError`` otherwise), which the window's ``requires`` states: on transformers 4 the patch
  is "not needed".

Where it shows: TRL 0.26.0 - 0.29.0 with ``tools=[...]`` on transformers >= 5 (transformers and vLLM
paths), and the main-branch builds from ca21dd94c to ebdfe826f.

Probe: ``GRPOTrainer`` has a ``_tool_call_loop`` that re-tokenises the conversation with
``apply_chat_template`` and no ``_get_tool_suffix_ids`` (the fix): "undecided" (with the reason
above, naming TRL 0.29.1). No ``_tool_call_loop`` (before 0.26.0) or the fix present (0.29.1+):
"not needed". ``apply`` is never reached.

Delete when: TRL 0.26.0 - 0.29.0 are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import not_needed, undecided
from trl_compat._helpers.source import code

PATCH_ID = "tool-loop-retokenization"
UPGRADE_TO = "0.29.1"


def probe(module):
    trainer = module.GRPOTrainer
    loop = getattr(trainer, "_tool_call_loop", None)
    if loop is None:
        return not_needed("GRPOTrainer has no tool-calling loop (_tool_call_loop)")
    if hasattr(trainer, "_get_tool_suffix_ids") or "_get_tool_suffix_ids" in code(loop):
        return not_needed("GRPOTrainer._tool_call_loop keeps the sampled ids and tokenises only the tool suffix (PR #5242)")
    if "apply_chat_template" not in code(loop):
        return not_needed("GRPOTrainer._tool_call_loop does not re-tokenise the conversation")
    return undecided(
        "GRPOTrainer._tool_call_loop re-tokenises prompt + sampled completion + tool result with the chat template: "
        "silent, the loss scores ids the model never sampled and tool_mask's boundary shifts; when the re-tokenised "
        "completion is shorter, tool_mask outgrows completion_ids ('The size of tensor a ... must match'). "
        f"Not fixed in place (the fix is TRL's token-in/token-out series #5225-#5242): use TRL >= {UPGRADE_TO} for tools"
    )


def apply(module, patcher):
    raise NotImplementedError(f"{PATCH_ID} has no in-place fix: use TRL >= {UPGRADE_TO} for tool calling")
