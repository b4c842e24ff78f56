"""vlm-tool-messages: a VLM run whose prompts hold a tool call's turns (an assistant turn with
``tool_calls``, the ``tool`` message with its result) dies at its first step:
``ValueError: Invalid role in message: tool. Expected 'user', 'assistant', or 'system'.`` (TRL 0.26.0 -
0.29.0), or ``TypeError: string indices must be integers, not 'str'`` (TRL 0.29.1 - 1.0.x).

The bug
    When a batch has images, ``GRPOTrainer._generate_and_score_completions`` turns each conversational
    prompt into the structured format a processor reads: ``prepare_multimodal_messages(prompt,
    image_list)`` (``trl.data_utils``, imported by name into the trainer's module; RLOO, SFT, DPO and
    the experimental GRPO subclasses import it the same way). Its result is what the processor
    renders and tokenises: ``processing_class.apply_chat_template(conversation=prompts,
    tokenize=True, ...)`` in ``_generate_single_turn`` (0.26 - 0.29.0) or ``_tokenize_prompts``
    (0.29.1 - 1.0), whose ids the model is given. Two shapes of the function:

    * TRL 0.26.0 - 0.29.0 know the roles ``system``, ``user``, ``assistant`` only: a ``tool`` message
      raises the ValueError above, an assistant turn whose ``content`` is None (what ``datasets`` makes
      of a tool call's turn without text) raises ``TypeError: 'NoneType' object is not iterable`` and
      one without ``content`` ``KeyError: 'content'``. Tool calling arrived in 0.26.0 (PR #4300), so a
      prompt with past tool turns is a conversation TRL's own tool loop writes.
    * PR #5212 (``f9df7ba45``; ``4ea285adf`` on the release branch, first in 0.29.1) passes ``tool``
      messages through untouched and wraps an assistant's string only when it is not empty
      (``message.get("content") and isinstance(...)``). A tool result stays a bare string, which
      transformers' ``ProcessorMixin.apply_chat_template`` iterates, when it tokenises, as content
      blocks: ``content["type"]`` on a character raises the TypeError above. An assistant turn with
      ``"content": ""`` (as TRL's own ``parse_response`` writes a tool call's turn) stays ``""``, on
      which the templates of several processors raise (PR #5496 names Idefics2/3, SmolVLM, LLaVA,
      LLaVA-NeXT, Qwen3-VL); Idefics3/SmolVLM's reads ``message['content'][0]['type']``:
      ``jinja2.exceptions.UndefinedError: str object has no element 0``.

    Upstream: PR #5440 (``0cb9667f3``) wraps a tool message's string, PR #5496 (``d4caab865``) an empty
    one too, for the assistant and the tool (``isinstance(message.get("content"), str)``); both first in
    1.1.0. An assistant turn without content (None, or no key) is left as it is from 0.29.1 on.

How the probe recognises it
    The trainer module's ``prepare_multimodal_messages`` (read through other patches' wrappers) takes
    ``messages`` and ``images``; its code wraps only a non-empty string
    (``message.get("content") and isinstance(message["content"], str)``) or skips the tool branch
    (``== "tool" : continue``): needed (0.29.1 - 1.0.x, main before PR #5496). It wraps every string
    (``isinstance(message.get("content"), str)``): not needed (1.1.0 on). It has an ``assistant``
    branch, raises, and has no ``tool`` branch: needed (0.26.0 - 0.29.0). No such function in the
    module, or TRL 0.20 - 0.25's ``(messages, num_images)`` (no tool calling before 0.26.0): not needed. Any other shape: undecided.

The fix
    ``prepare_multimodal_messages`` is wrapped where the trainer module binds it, in ``trl.data_utils``
    and in every module of the registry's list that had imported TRL's function by name when the patch
    applied (a module imported later takes the wrapper from ``trl.data_utils``). Where a prompt has a
    ``tool`` message or an assistant turn whose content is not a non-empty string or a list, the
    wrapper gives TRL 1.1.0's answer: each assistant or tool message's string content (an empty one
    too) becomes one text block, ``[{"type": "text", "text": ...}]``; the tool messages and the
    assistant turns without content are kept out of TRL's call (so that 0.26's function neither
    rejects nor iterates them; 1.1.0 does not count their image placeholders either) and put back,
    copied, at their places in its answer. The messages (read by name) go to TRL's function
    otherwise untouched, with the other arguments as they came: its image placeholders, its image
    count check and its copies stay TRL's. Any other prompt goes to TRL's function as it is.
    A wrapper a later module took keeps TRL's behaviour once the patch is reverted.

Run time: load-bearing: errors propagate. What the wrapper does is the fix itself: falling back to
TRL's own code on an error would be the crash it prevents (``trl_compat._engine.guarded``).

Delete when: TRL 0.26.0 - 1.0.x are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import sys

from trl_compat import _engine
from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, unwrap

PATCH_ID = "vlm-tool-messages"
NAME = "prepare_multimodal_messages"
DATA_UTILS = "trl.data_utils"

# 0.29.1 - 1.0.x (PR #5212): an assistant's string wrapped only when not empty, a tool message skipped;
# main between PRs #5440 and #5496: the tool's string wrapped only when not empty
_NON_EMPTY_ONLY = 'message.get("content") and isinstance(message["content"], str)'
_TOOL_SKIPPED = 'elif message["role"] == "tool" : continue'
# 1.1.0 on (PR #5496): every string wrapped
_EVERY_STRING = 'isinstance(message.get("content"), str)'
# 0.26.0 - 0.29.0: the three roles of TRL < 0.29.1, the rest raises
_ASSISTANT = 'elif message["role"] == "assistant"'
_TOOL = 'message["role"] == "tool"'
_RAISES = "raise ValueError("


def probe(module):
    prepare = getattr(module, NAME, None)
    if prepare is None:
        return not_needed(f"the GRPO trainer module has no {NAME} (no structured VLM prompts)")
    try:
        parameters = inspect.signature(unwrap(prepare)).parameters
    except (TypeError, ValueError):
        parameters = {}
    if "messages" in parameters and "num_images" in parameters:
        # TRL 0.20 - 0.25: prepare_multimodal_messages(messages, num_images), in place; no tool calling before
        # PR #4300 (0.26.0), so no tool turns in a prompt
        return not_needed(f"{NAME}(messages, num_images) of TRL < 0.26: no tool calling, no tool turns in VLM prompts")
    if "messages" not in parameters or "images" not in parameters:
        return undecided(f"{NAME} does not take messages and images, as this patch knows it")
    body = code(prepare)
    if _NON_EMPTY_ONLY in body or _TOOL_SKIPPED in body:
        return needed(
            f"{NAME} leaves a tool message's text (and an empty assistant text) a bare string: a VLM processor "
            "that tokenises the prompt raises TypeError: string indices must be integers"
        )
    if _EVERY_STRING in body:
        return not_needed(f"{NAME} wraps every assistant and tool string in a text block (TRL 1.1.0)")
    if _ASSISTANT in body and _RAISES in body and _TOOL not in body:
        return needed(f"{NAME} raises ValueError: Invalid role in message: tool (a VLM prompt with a tool call's turns)")
    return undecided(f"{NAME} handles tool and assistant messages in a way this patch does not know")


def _active() -> bool:
    """Whether the patch is applied: a wrapper a module took after apply() keeps TRL's behaviour once
    the patch is reverted."""
    try:
        return _engine.status(PATCH_ID) == _engine.APPLIED
    except KeyError:
        return False


def _needs_help(message) -> bool:
    """A message TRL < 1.1.0 rejects, iterates or leaves a bare string where 1.1.0 does not."""
    role = message.get("role")
    if role == "tool":
        return True
    content = message.get("content")
    return role == "assistant" and not (isinstance(content, list) or (isinstance(content, str) and content))


def _as_in_1_1(message):
    """TRL 1.1.0's assistant and tool message: its string content (an empty one too) as one text block."""
    if message.get("role") in ("assistant", "tool") and isinstance(message.get("content"), str):
        return {**message, "content": [{"type": "text", "text": message["content"]}]}
    return message


def _kept_out(message) -> bool:
    """A message TRL 1.1.0 neither counts nor fills images in: a tool message, a content-less assistant turn."""
    role = message.get("role")
    return role == "tool" or (role == "assistant" and not message.get("content"))


def _wrap(original, active=_active):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def prepare_multimodal_messages(*args, **kwargs):
        if signature is None or not active():
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # TRL's own error for a call its signature rejects
        messages = bound.arguments.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return original(*args, **kwargs)
        if not any(_needs_help(m) for m in messages):
            return original(*args, **kwargs)
        messages = [_as_in_1_1(m) for m in messages]
        kept_out = {i: m for i, m in enumerate(messages) if _kept_out(m)}
        shown = [m for i, m in enumerate(messages) if i not in kept_out]
        bound.arguments["messages"] = shown
        prepared = list(original(*bound.args, **bound.kwargs))
        if len(prepared) != len(shown):  # not one message out per message in: not the function this patch knows
            return original(*args, **kwargs)
        for i in sorted(kept_out):
            prepared.insert(i, copy.deepcopy(kept_out[i]))
        return prepared

    return prepare_multimodal_messages


def apply(module, patcher) -> None:
    importlib.import_module(DATA_UTILS)
    original = getattr(module, NAME)
    wrapper = patcher.wrap(module, NAME, _wrap)
    # the other modules that import it by name: the registry's `changes` list them (``"module:name"``)
    for target in patcher.declared or ():
        module_name, _, attribute = target.partition(":")
        other = sys.modules.get(module_name)
        if attribute == NAME and other is not None and other is not module and vars(other).get(NAME) is original:
            patcher.replace(other, NAME, wrapper, above=original)
