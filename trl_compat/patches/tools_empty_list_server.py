"""tools-empty-list-server: TRL 0.26.0, server mode, conversational prompts and no tools: the first
generation fails with ``NotImplementedError: Tool calling is not yet implemented in VLLMClient.chat().``

The bug: TRL 0.26.0's ``GRPOTrainer.__init__`` sets ``self.tools = tools or []`` and its server-mode
generation calls ``self.vllm_client.chat(..., tools=self.tools)`` for conversational prompts;
``VLLMClient.chat`` raises ``NotImplementedError`` when ``tools is not None``, so every server-mode
run (``use_vllm=True``, ``vllm_mode="server"``, TRL's default) with chat-style prompts and no tools
dies at its first generation, client-side, before any request is sent. Fixed by TRL PR #4663
(9897c9f83, ``self.tools = tools``), released in 0.26.1. Where it shows: TRL 0.26.0 (and main-branch
0.26.0.dev0 builds from the ``tools or []`` line to #4663).

Probe: ``GRPOTrainer.__init__``'s source has ``self.tools = tools or []`` and ``VLLMClient.chat``'s
has ``if tools is not None`` followed by ``raise NotImplementedError``: "needed"; otherwise "not
needed". "Undecided" when a source cannot be read.

Fix: ``VLLMClient.chat`` is wrapped so that ``tools`` bound to an empty list (by name, through the
method's signature) reaches it as ``None``: what 0.26.1 passes for "no tools". A non-empty list is
passed on untouched (and still raises TRL's NotImplementedError: tool calling in server mode is not
implemented in 0.26).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code


def probe(module):
    if "self.tools = tools or []" not in code(module.GRPOTrainer.__init__):
        return not_needed("GRPOTrainer keeps tools=None as None")
    chat = getattr(getattr(module, "VLLMClient", None), "chat", None)  # VLLMClient.chat came in 0.25
    if chat is None:
        return not_needed("this TRL's VLLMClient has no chat()")
    if "if tools is not None : raise NotImplementedError" not in code(chat):
        return not_needed("VLLMClient.chat accepts an empty tools list")
    return needed("GRPOTrainer passes tools=[] (tools or []) to VLLMClient.chat, which raises on any tools that is not None")


def no_empty_tools(chat):
    signature = inspect.signature(chat)

    @functools.wraps(chat)
    def wrapper(*args, **kwargs):
        try:
            bound = signature.bind_partial(*args, **kwargs)
        except TypeError:
            return chat(*args, **kwargs)  # TRL's own error for a call its signature rejects
        if "tools" in bound.arguments and isinstance(bound.arguments["tools"], list) and not bound.arguments["tools"]:
            bound.arguments["tools"] = None
            return chat(*bound.args, **bound.kwargs)
        return chat(*args, **kwargs)

    return wrapper


def apply(module, patcher):
    patcher.wrap(module.VLLMClient, "chat", no_empty_tools)
