"""tools-empty-list-template: a run without tools hands the chat template ``tools=[]``; templates that
test ``tools is not none`` (Llama 3.1 / 3.2 / 3.3) then write their tool-calling boilerplate into
every prompt.

The bug (TRL issue #5379): ``GRPOTrainer.__init__`` turns ``tools=None`` into an empty list and
every chat rendering of the prompts passes it on as ``tools=self.tools``. Meta's Llama 3.x
templates set ``tools`` to ``none`` only when it is undefined and render "Environment: ipython" and
the function-calling instructions whenever ``tools is not none``: ``[]`` counts as tools. Every
prompt of a run without tools then carries that boilerplate, in generation and in the loss alike
(a silent change of the task, not an off-policy error). Releases:

- 0.26.0: ``self.tools = tools or []``; the list reaches ``processing_class.apply_chat_template``
  (transformers generation), ``LLM.chat`` (colocated vLLM) and ``VLLMClient.chat`` (server mode,
  where it raises instead: ``tools-empty-list-server``). PR #4663 (0.26.1) went back to
  ``self.tools = tools``: 0.26.1 - 0.27.2 are clean.
- 0.28.0: ``self.tools = tools or []`` again; also handed to ``VLLMGeneration(tools=...)``, which
  passes it to ``LLM.chat`` / ``VLLMClient.chat``.
- 0.29.0 - 0.29.1 (and main up to the fix): ``tools = tools or []``, ``self.tools = tools + ...``;
  the prompts are tokenised by the trainer, ``apply_chat_template(conversation=prompts,
  tools=self.tools, ...)``.

Fixed by PR #5380 (4890abf0a, in 1.0.0): ``tools=self.tools or None`` at the trainer's call site
and ``tools = tools or None`` in ``trl.data_utils.apply_chat_template``.

Probe: ``GRPOTrainer.__init__`` has ``tools or []`` and the trainer (or 0.28's ``VLLMGeneration``)
passes ``tools=self.tools`` on, with no ``tools=self.tools or None`` anywhere: "needed". No
``tools or []``, or the ``or None`` of #5380: "not needed". ``tools or []`` with neither call
shape: "undecided".

Fix: after ``GRPOTrainer.__init__``, an empty tools list (on the trainer and on its
``vllm_generation``) becomes ``None``, what 0.26.1 - 0.27.2 keep and #5380 passes. Every later use of
``self.tools`` in these releases tests its truth (``if self.tools:``) or passes it to a chat
template, so ``None`` changes nothing else. A non-empty list (tools, or 0.29's environment methods)
is left as it is.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.26.0 and 0.28.0 - 0.29.1 (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

FIXED = "tools=self.tools or None"  # PR #5380
PASSES_ON = "tools=self.tools,"


def _sources(module) -> list:
    sources = [code(module.GRPOTrainer)]
    generation = getattr(module, "VLLMGeneration", None)  # 0.28+: the engine calls live there
    if isinstance(generation, type):
        sources.append(code(generation))
    return sources


def _passes(sources, needle: str) -> bool:
    return any(needle in source for source in sources)


def probe(module):
    if "tools or []" not in code(module.GRPOTrainer.__init__):
        return not_needed("GRPOTrainer keeps tools=None as None")
    sources = _sources(module)
    if _passes(sources, FIXED):
        return not_needed("TRL passes tools=self.tools or None to the chat template (PR #5380)")
    if _passes(sources, PASSES_ON) or _passes(sources, "tools = self.tools"):
        return needed(
            "GRPOTrainer turns tools=None into [] (tools or []) and passes it to the chat template: templates that "
            "test `tools is not none` (Llama 3.x) render tool boilerplate into every prompt"
        )
    return undecided("GRPOTrainer turns tools=None into [], but passes it on in code of an unknown shape")


def _no_empty_tools(trainer, arguments) -> None:
    for holder in (trainer, getattr(trainer, "vllm_generation", None)):
        if holder is None or not hasattr(holder, "__dict__"):
            continue
        tools = vars(holder).get("tools")
        if isinstance(tools, list) and not tools:
            holder.tools = None


apply = around_init(after=_no_empty_tools)
