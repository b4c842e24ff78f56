"""tools-template-prefix-check: with ``tools=[...]``, ``GRPOTrainer(...)`` refuses a chat template that
works for tool calling (``ValueError: The tokenizer's chat template is not prefix-preserving and
patching is not supported for this template``), for instance every template whose generation prompt
opens a thinking block (``<think>``) that a past assistant turn does not show.

The bug
    The agent training of PR #4300 (``ca21dd94c``, released in 0.26.0) has ``GRPOTrainer.__init__``
    call ``trl.chat_template_utils.get_training_chat_template(processing_class)`` whenever tools are
    given. It returns None when ``is_chat_template_prefix_preserving`` accepts the template, TRL's
    training template for Qwen3 (and Qwen3.5 in 1.0) otherwise, and else raises the error above. The
    check asks that ``[user]`` with the generation prompt renders as a prefix of ``[user, assistant]``,
    and that one as a prefix of ``[user, assistant, user]``. Up to 0.29.0 the tool loop re-tokenises the
    whole conversation after each tool call and raises unless the result extends what was generated, so
    it needs that very property and the refusal at construction is right. PR #5242 (0.29.1) made the
    loop token-in/token-out: it appends the ids of the tool results (``_get_tool_suffix_ids``) after an
    assistant turn with tool calls. From then the check asks more than the loop needs: a template whose
    generation prompt is ``<|im_start|>assistant\\n<think>\\n`` while a rendered assistant turn starts
    ``<|im_start|>assistant\\n`` fails it, and tool calling works with it. PR #5458 (``f19fda4c0``, released in
    1.1.0: "Narrow prefix-preserving check to the actual requirement") checks exactly that:
    ``[user, assistant with a tool call]`` must render as a prefix of the same with a tool message
    and the generation prompt; and from 1.1.0 ``GRPOTrainer.__init__`` calls
    ``get_training_chat_template`` only when that check fails.

How the probe recognises it
    The trigger module has no ``get_training_chat_template``: not needed (no tool calling before
    0.26). ``GRPOTrainer`` has no ``_get_tool_suffix_ids``: not needed (the re-tokenising loop of
    0.26.0 - 0.29.0). ``GRPOTrainer.__init__`` calls ``is_chat_template_prefix_preserving(`` itself: not needed
    (1.1.0 on). ``get_training_chat_template`` calls it and raises, and the check's source names no
    ``tool_calls`` (the old three-conversation check): needed. A check that names ``tool_calls``:
    not needed (the main-branch builds with PR #5458). Any other shape: undecided.

The fix
    The trainer module's ``get_training_chat_template`` (the name ``__init__`` calls) is wrapped:
    TRL's function runs first and its answer stands (None, or TRL's own training template). Only where
    it raises that error and the template passes PR #5458's check (:func:`keeps_tool_turn_prefix`, its
    code) does the wrapper return None, as 1.1.0's ``__init__`` decides for such a template: the
    template is used as it is, and a warning says so once. A template that fails both checks still
    raises TRL's error. The tool loop's own check (``_get_tool_suffix_ids`` raises "Unexpected
    tokenization" where a prefix is not kept) stays. The tokenizer is read from the call by name.

Run time: load-bearing: errors propagate (without the fix ``GRPOTrainer(...)`` raises anyway).

Delete when: TRL 0.29.1 - 1.0.x are no longer supported (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import logging

from trl_compat._engine import needed, not_needed, undecided, warn_once
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import code, unwrap

log = logging.getLogger(__name__)

PATCH_ID = "tools-template-prefix-check"
NAME = "get_training_chat_template"
CHECK = "is_chat_template_prefix_preserving"
REFUSAL = "is not prefix-preserving"
SUFFIX_IDS = "_get_tool_suffix_ids"  # the token-in/token-out tool loop (0.29.1 on)


def probe(module):
    training_template = getattr(module, NAME, None)
    if training_template is None:
        return not_needed(f"the GRPO trainer module has no {NAME} (no tool calling)")
    if not hasattr(module.GRPOTrainer, SUFFIX_IDS):
        return not_needed(f"the tool loop re-tokenises each conversation and needs what {CHECK} checks here (no {SUFFIX_IDS})")
    if f"{CHECK}(" in code(module.GRPOTrainer.__init__):
        return not_needed(f"GRPOTrainer.__init__ asks {CHECK} (the tool-call check of PR #5458) before {NAME}")
    body = code(training_template)
    if f"{CHECK}(" not in body or "raise ValueError" not in body:
        return undecided(f"{NAME} does not ask {CHECK} and raise, as this patch knows it")
    # the check the function calls: a global of its own module (trl.chat_template_utils)
    check = getattr(unwrap(training_template), "__globals__", {}).get(CHECK)
    if check is None:
        return undecided(f"{NAME}'s module has no {CHECK}")
    if "tool_calls" in code(check):
        return not_needed(f"{CHECK} checks a tool call's conversation (PR #5458)")
    return needed(f"{NAME} refuses a template that fails {CHECK}'s three-conversation check, more than tool calling needs")


def keeps_tool_turn_prefix(tokenizer) -> bool:
    """TRL 1.1.0's ``is_chat_template_prefix_preserving`` (PR #5458): an assistant turn with a tool
    call renders as a prefix of the same conversation with a tool message and the generation prompt."""
    dummy_tool_calls = [{"type": "function", "function": {"name": "dummy", "arguments": {}}}]
    messages1 = [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "", "tool_calls": dummy_tool_calls},
    ]
    messages2 = [*messages1, {"role": "tool", "name": "dummy", "content": "dummy"}]
    text1 = tokenizer.apply_chat_template(messages1, tokenize=False)
    text2 = tokenizer.apply_chat_template(messages2, tokenize=False, add_generation_prompt=True)
    return text2.startswith(text1)


def _wrap(original):
    @functools.wraps(original)
    def get_training_chat_template(*args, **kwargs):
        try:
            return original(*args, **kwargs)
        except ValueError as error:
            tokenizer = next(iter(arguments(original, *args, **kwargs).values()), None)
            if REFUSAL not in str(error) or tokenizer is None or not keeps_tool_turn_prefix(tokenizer):
                raise
        warn_once(
            log,
            PATCH_ID,
            "trl_compat %s: the chat template fails TRL's old prefix check, but keeps an assistant turn with a "
            "tool call as the prefix of the turn after its tool result, which is what tool calling needs (TRL "
            "1.1.0's check): it is used as it is",
            PATCH_ID,
        )
        return None

    return get_training_chat_template


def apply(module, patcher):
    patcher.wrap(module, NAME, _wrap)
