"""tool-suffix-eos-newline: with tools and a Qwen3-style chat template (one that writes text after the
EOS of a turn, ``<|im_end|>\\n``), TRL 0.29.1 drops that text between each completion and its tool
result.

The bug (TRL issue #5317): 0.29.1 builds the next turn's input by concatenating ids, ``prompt +
completion + suffix`` (token-in/token-out, PR #5242, cherry-picked as 3a5b99bdd). ``GRPOTrainer.
_get_tool_suffix_ids`` renders a dummy ``user, assistant`` conversation (``prefix``) and the same
plus the tool messages (``full``) and returns ``full[len(prefix):]``. ``prefix`` ends with
``<|im_end|>\\n``, but generation stops at ``<|im_end|>``: the ``\\n`` is never sampled nor put
back, so every tool turn reads ``...<|im_end|><|im_start|>user\\n<tool_response>...`` instead of the
template's ``...<|im_end|>\\n<|im_start|>user...``. The model is trained and sampled on a
conversation layout its template never produces (the suffix ids are masked out of the loss, but
the completions after them condition on them). Qwen3 and Qwen3.5 templates are affected; a
template that writes nothing after EOS is not.

Fixed by PR #5330 (5bb083cf8, in 1.0.0): the prefix is cut after its last EOS before slicing, so
the suffix starts with what the template writes after EOS. 0.29.1 is the only release with the
bug: before it, tools were re-tokenised (``tool-loop-retokenization``).

Probe: ``GRPOTrainer._get_tool_suffix_ids`` (absent before 0.29.1: "not needed") slices
``full_ids[len(prefix_ids) :]`` and never looks at ``eos_token_id``: "needed"; with
``eos_token_id`` (#5330): "not needed"; another shape: "undecided".

Fix: ``_get_tool_suffix_ids`` is replaced by #5330's version (the same two renderings, the prefix
cut after its last EOS). A prefix with no EOS in it (a template that writes none) is kept whole,
as 0.29.1 does, instead of #5330's ``max()`` of nothing.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.29.1 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

SLICE = "return full_ids[len(prefix_ids) :]"
DUMMY = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]


def probe(module):
    method = getattr(module.GRPOTrainer, "_get_tool_suffix_ids", None)
    if method is None:
        return not_needed("this TRL re-tokenises tool turns (no _get_tool_suffix_ids)")
    source = code(method)
    if "eos_token_id" in source:
        return not_needed("_get_tool_suffix_ids cuts the prefix at its last EOS (PR #5330)")
    if SLICE in source and "prefix_ids = self.processing_class.apply_chat_template(" in source:
        return needed(
            "_get_tool_suffix_ids slices after the whole rendered prefix: with templates writing text after EOS "
            "(Qwen3 <|im_end|>\\n) that text is lost between each completion and its tool result"
        )
    return undecided("_get_tool_suffix_ids has an unknown shape")


def _suffix_ids(self, tool_messages):
    """The ids a template writes after a completion's EOS, the tool messages and the next turn's header."""
    render = dict(chat_template=self.chat_template, return_dict=False, **self.chat_template_kwargs)
    prefix_ids = list(self.processing_class.apply_chat_template(DUMMY, add_generation_prompt=False, **render))
    full_ids = list(self.processing_class.apply_chat_template(DUMMY + tool_messages, add_generation_prompt=True, **render))
    eos = [i for i, token_id in enumerate(prefix_ids) if token_id == self.eos_token_id]
    if eos:  # the completion ends at EOS: what the template writes after it belongs to the suffix
        prefix_ids = prefix_ids[: eos[-1] + 1]
    if full_ids[: len(prefix_ids)] != prefix_ids:
        raise ValueError("Unexpected tokenization: the EOS-trimmed prefix IDs are not a prefix of the full IDs.")
    return full_ids[len(prefix_ids) :]


def _make_suffix_ids(original):
    @functools.wraps(original)
    def _get_tool_suffix_ids(self, *args, **kwargs):
        return _suffix_ids(self, *args, **kwargs)  # binds tool_messages by name, as TRL's does

    return _get_tool_suffix_ids


def apply(module, patcher):
    patcher.wrap(module.GRPOTrainer, "_get_tool_suffix_ids", _make_suffix_ids)
