"""The prompt vLLM generates from, made the prompt GRPO computes the loss on: the one helper
behind the patches ``vllm-prompt-truncation``, ``vllm-prompt-special-tokens`` and
``vllm-double-bos``.

TRL 0.14 - 0.19 turn each prompt into text (the chat template applied as text), tokenise it
*without* special tokens for training (``add_special_tokens=False``, keeping the last
``max_prompt_length`` ids) and hand vLLM a text, which vLLM tokenises again, *with* special
tokens. Three ways the two differ, one per patch:

* ``vllm-prompt-truncation`` (0.14 - 0.18): vLLM gets the untruncated text;
* ``vllm-prompt-special-tokens`` (0.19.0): vLLM gets the truncated ids decoded with
  ``skip_special_tokens=True``: chat-template tokens and BOS gone;
* ``vllm-double-bos`` (0.14 - 0.19): vLLM adds the tokenizer's special tokens (a BOS) to a text
  that already starts with the BOS text: two BOS ids where training has one.

How: each patch wraps the trainer method that tokenises the prompts and calls vLLM
(``compute_loss`` in 0.14, ``_prepare_inputs`` in 0.15, ``_generate_and_score_completions`` from 0.16)
in :func:`wrap_generation`. While that method runs,
the vLLM entry points of the trainer (``self.llm.generate`` and ``self.vllm_client.generate``,
whichever the trainer has) are wrapped on the instance, and each text prompt is corrected for
the bugs whose patches are applied, and only those, so that each patch can be reverted and tested
on its own:

* the in-process engine (``self.llm``, TRL 0.14/0.15 and 0.18/0.19 ``vllm_mode="colocate"``)
  gets the corrected prompt as token ids, ``{"prompt_token_ids": [...]}``: exactly the ids the loss
  is computed on;
* the server client (``self.vllm_client``, TRL 0.16+ ``vllm_mode="server"``) only takes text: it
  gets the corrected ids decoded with their special tokens, less the special tokens the server's
  tokenizer will add again, so that the server's tokenisation gives back the same ids (checked;
  where it cannot, a warning says so once).

A prompt that needs no correction is passed on untouched, so a run that has none of these bugs
generates what it generated without trl_compat.

Here: finding the generation method, wrapping it, and the probe and apply the three patch modules
share (:func:`prompt_patch`: each module only judges the method's code); the corrections
themselves are in ``handoff``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from typing import Any, Callable

from trl_compat._engine import Verdict, undecided
from trl_compat._helpers.source import code, defining_class
from trl_compat._helpers.vllm_prompts.handoff import DOUBLE_BOS, SPECIAL_TOKENS, TRUNCATION, Handoff  # noqa: F401

_STATE = "_trl_compat_vllm_prompts"


# Where TRL tokenises the prompts and calls vLLM: compute_loss (0.14), _prepare_inputs (0.15),
# _generate_and_score_completions (0.16 - 0.23), _generate_single_turn (0.24+, where the prompt
# patches' windows have ended: found so that their probes can say why).
_CANDIDATES = ("_generate_and_score_completions", "_prepare_inputs", "compute_loss", "_generate_single_turn")


def calls_vllm(source) -> bool:
    return "self.llm.generate(" in source or "self.vllm_client.generate(" in source


def trains_on_vllm_prompt_ids(source) -> bool:
    """TRL >= 0.24 (PR #4152) trains on the prompt ids vLLM ran (``output.prompt_token_ids`` of the
    in-process engine, the server's ``"prompt_ids"``), whatever vLLM's tokenisation gave."""
    return "output.prompt_token_ids for output in all_outputs" in source


def generation_method(cls: type) -> str | None:
    """The GRPOTrainer method that tokenises the prompts and calls vLLM (None: none found).
    Raises SourceUnavailable when a candidate's source cannot be read."""
    for name in _CANDIDATES:
        if defining_class(cls, name) is not None and calls_vllm(code(getattr(cls, name))):
            return name
    return None


def calls_vllm_with_text(source) -> bool:
    """TRL hands vLLM the prompt *texts*: the in-process ``self.llm.generate(all_prompts_text``
    (0.14/0.15, 0.18/0.19 colocate; 0.20 - 0.23: ``vllm_inputs = all_prompts_text``) or the server
    client's ``prompts=ordered_set_of_prompts``."""
    return (
        "self.llm.generate(all_prompts_text" in source
        or ("vllm_inputs = all_prompts_text" in source and "self.llm.generate(vllm_inputs" in source)
        or "self.vllm_client.generate(prompts=ordered_set_of_prompts" in source
    )


def wrap_generation(module, patcher, fix: str) -> None:
    """Apply ``fix`` (one of the three patch ids): wrap GRPOTrainer's generation method so that,
    while it runs, vLLM's prompts are corrected for ``fix``."""
    cls = module.GRPOTrainer
    name = generation_method(cls)

    def factory(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            # the batch of prompt dicts: ``inputs`` of compute_loss(self, model, inputs, ...) and of
            # _prepare_inputs / _generate_and_score_completions(self, inputs)
            try:
                inputs = signature.bind_partial(self, *args, **kwargs).arguments.get("inputs")
            except TypeError:  # TRL reports the call as it always did
                inputs = None
            with _correcting(self, fix, inputs):
                return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(cls, name, factory)


def probe_generation(module, judge: Callable[[str, Any], Verdict]) -> Verdict:
    """What the three probes share: find GRPOTrainer's generation method and let ``judge`` decide
    from its name and code."""
    cls = module.GRPOTrainer
    name = generation_method(cls)
    if name is None:
        return undecided("no GRPOTrainer method calls self.llm.generate / self.vllm_client.generate")
    return judge(name, code(getattr(cls, name)))


def prompt_patch(fix: str, judge: Callable[[str, Any], Verdict]):
    """``(probe, apply)`` of the prompt patch ``fix`` (one of the three ids): the probe lets
    ``judge(name, code)`` decide from GRPOTrainer's generation method, apply wraps that method."""

    def probe(module) -> Verdict:
        return probe_generation(module, judge)

    def apply(module, patcher) -> None:
        wrap_generation(module, patcher, fix)

    return probe, apply


# -- the instance wrappers ---------------------------------------------------------------------


@contextlib.contextmanager
def _correcting(trainer, fix: str, inputs: Any):
    state = trainer.__dict__.get(_STATE)
    outermost = state is None
    if outermost:
        state = Handoff(trainer)
        trainer.__dict__[_STATE] = state
        state.install()
    state.fixes.append(fix)
    try:
        if fix == SPECIAL_TOKENS:
            state.remember_training_ids(inputs)
        yield
    finally:
        state.fixes.remove(fix)
        if outermost:
            state.uninstall()
            trainer.__dict__.pop(_STATE, None)
