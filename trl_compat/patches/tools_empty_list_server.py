"""tools-empty-list-server: TRL 0.26.0 and 0.28.0, server mode, conversational prompts and no tools:
the first generation fails with ``NotImplementedError: Tool calling is not yet implemented in
VLLMClient.chat().``

The bug: TRL 0.26.0's ``GRPOTrainer.__init__`` sets ``self.tools = tools or []`` and its server-mode
generation calls ``self.vllm_client.chat(..., tools=self.tools)`` for conversational prompts;
``VLLMClient.chat`` raises ``NotImplementedError`` when ``tools is not None``, so every server-mode
run (``use_vllm=True``, ``vllm_mode="server"``, TRL's default) with chat-style prompts and no tools
dies at its first generation, client-side, before any request is sent. Fixed by TRL PR #4663
(9897c9f83, ``self.tools = tools``), released in 0.26.1 and kept in 0.27.x. TRL 0.28.0 brought the
line back when generation moved to ``trl/generation/vllm_generation.py`` (``self.tools = tools or
[]`` again, passed to ``VLLMGeneration(tools=...)``, whose server path calls
``trl.generation.vllm_client.VLLMClient.chat(..., tools=tools)``, which still raises on any list).
TRL 0.29.0 implements tool calling in ``VLLMClient.chat`` (no ``NotImplementedError`` left).
Where it shows: TRL 0.26.0 and 0.28.0 (and the main-branch builds with both lines).

Probe: ``GRPOTrainer.__init__``'s source has ``self.tools = tools or []`` and ``VLLMClient.chat``'s
(the class the trainer module binds up to 0.27, ``trl.generation.vllm_client``'s from 0.28) has
``if tools is not None`` followed by ``raise NotImplementedError``: "needed"; otherwise "not
needed" (0.26.1 - 0.27.x keep ``tools=None``; 0.29 accepts tools). "Undecided" when a source
cannot be read.

Fix: ``VLLMClient.chat`` is wrapped so that ``tools`` bound to an empty list (by name, through the
method's signature) reaches it as ``None``: what 0.26.1 passes for "no tools". A non-empty list is
passed on untouched (and still raises TRL's NotImplementedError: tool calling in server mode is not
implemented in 0.26 - 0.28).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.26.0 and 0.28.x (the registry's ``remove_when``; a
test holds the two equal).
"""

from __future__ import annotations

import functools
import importlib
import inspect

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code


def probe(module):
    if "self.tools = tools or []" not in code(module.GRPOTrainer.__init__):
        return not_needed("GRPOTrainer keeps tools=None as None")
    chat = getattr(client_class(module), "chat", None)  # VLLMClient.chat came in 0.25
    if chat is None:
        return not_needed("this TRL's VLLMClient has no chat()")
    if "if tools is not None : raise NotImplementedError" not in code(chat):
        return not_needed("VLLMClient.chat accepts an empty tools list")
    return needed("GRPOTrainer passes tools=[] (tools or []) to VLLMClient.chat, which raises on any tools that is not None")


def client_class(module):
    """The ``VLLMClient`` the trainer's server mode uses: bound in the trainer module up to TRL 0.27,
    built by ``trl.generation.vllm_generation`` from 0.28 (None if neither has one)."""
    client = getattr(module, "VLLMClient", None)
    if client is not None:
        return client
    try:
        return importlib.import_module("trl.generation.vllm_client").VLLMClient
    except (ImportError, AttributeError):
        return None


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
    patcher.wrap(client_class(module), "chat", no_empty_tools)
