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
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Dict, List, Optional, Sequence

from trl_compat._source import code, defining_class

log = logging.getLogger("trl_compat")

TRUNCATION = "vllm-prompt-truncation"
SPECIAL_TOKENS = "vllm-prompt-special-tokens"
DOUBLE_BOS = "vllm-double-bos"

_STATE = "_trl_compat_vllm_prompts"


# Where TRL tokenises the prompts and calls vLLM: compute_loss (0.14), _prepare_inputs (0.15),
# _generate_and_score_completions (0.16+).
_CANDIDATES = ("_generate_and_score_completions", "_prepare_inputs", "compute_loss")


def calls_vllm(source) -> bool:
    return "self.llm.generate(" in source or "self.vllm_client.generate(" in source


def generation_method(cls: type) -> Optional[str]:
    """The GRPOTrainer method that tokenises the prompts and calls vLLM (None: none found).
    Raises SourceUnavailable when a candidate's source cannot be read."""
    for name in _CANDIDATES:
        if defining_class(cls, name) is not None and calls_vllm(code(getattr(cls, name))):
            return name
    return None


def calls_vllm_with_text(source) -> bool:
    """TRL hands vLLM the prompt *texts*: the in-process ``self.llm.generate(all_prompts_text``
    (0.14/0.15, 0.18/0.19 colocate) or the server client's ``prompts=ordered_set_of_prompts``."""
    return ("self.llm.generate(all_prompts_text" in source
            or "self.vllm_client.generate(prompts=ordered_set_of_prompts" in source)


def wrap_generation(module, patcher, fix: str) -> None:
    """Apply ``fix`` (one of the three patch ids): wrap GRPOTrainer's generation method so that,
    while it runs, vLLM's prompts are corrected for ``fix``."""
    cls = module.GRPOTrainer
    name = generation_method(cls)
    # the batch of prompt dicts: ``inputs`` of compute_loss(self, model, inputs, ...) and of
    # _prepare_inputs / _generate_and_score_completions(self, inputs)
    position = 1 if name == "compute_loss" else 0

    def factory(original):
        @functools.wraps(original)
        def wrapper(self, *args, **kwargs):
            inputs = args[position] if len(args) > position else kwargs.get("inputs")
            with _correcting(self, fix, inputs):
                return original(self, *args, **kwargs)

        return wrapper

    patcher.wrap(cls, name, factory)


# -- the instance wrappers ---------------------------------------------------------------------


@contextlib.contextmanager
def _correcting(trainer, fix: str, inputs: Any):
    state = trainer.__dict__.get(_STATE)
    outermost = state is None
    if outermost:
        state = _Handoff(trainer)
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


class _Handoff:
    """The corrections in force for one call of the generation method of one trainer."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.fixes: List[str] = []
        self.lossy: Dict[str, Optional[list]] = {}  # 0.19.0's decoded text -> training ids (None: ambiguous)
        self._undo: List[Any] = []

    # wrapping -------------------------------------------------------------------------------
    def install(self) -> None:
        for attr, as_ids in (("llm", True), ("vllm_client", False)):
            engine = getattr(self.trainer, attr, None)
            if engine is None or not callable(getattr(engine, "generate", None)):
                continue
            self._wrap_generate(engine, as_ids)

    def _wrap_generate(self, engine, as_ids: bool) -> None:
        own = vars(engine).get("generate", _ABSENT) if hasattr(engine, "__dict__") else _ABSENT
        original = engine.generate

        @functools.wraps(original)
        def generate(*args, **kwargs):
            if args:
                args = (self.correct_all(args[0], as_ids),) + args[1:]
            elif "prompts" in kwargs:
                kwargs["prompts"] = self.correct_all(kwargs["prompts"], as_ids)
            return original(*args, **kwargs)

        engine.generate = generate

        def undo():
            if own is _ABSENT:
                vars(engine).pop("generate", None)
            else:
                engine.generate = own

        self._undo.append(undo)

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    # the corrections ------------------------------------------------------------------------
    @property
    def tokenizer(self):
        processing_class = self.trainer.processing_class
        return getattr(processing_class, "tokenizer", processing_class)  # a processor holds one

    def encode(self, text: str, special: bool) -> list:
        return list(self.tokenizer(text, add_special_tokens=special)["input_ids"])

    def added_by_vllm(self, text: str):
        """``(before, after)``: the special-token ids that tokenising ``text`` with special tokens
        (vLLM's way) puts around the ids training's tokenisation gives; None if the plain ids are
        not found inside."""
        full, plain = self.encode(text, special=True), self.encode(text, special=False)
        for start in range(len(full) - len(plain) + 1):
            if full[start:start + len(plain)] == plain:
                return full[:start], full[start + len(plain):]
        return None

    def training_ids(self, text: str) -> list:
        """TRL's training tokenisation of one prompt text: no special tokens added, the last
        ``max_prompt_length`` ids kept (left padding and truncation of the batch keep exactly these)."""
        ids = self.encode(text, special=False)
        limit = getattr(self.trainer, "max_prompt_length", None)
        return ids[-limit:] if limit is not None else ids

    def remember_training_ids(self, inputs: Any) -> None:
        """0.19.0 sends vLLM ``batch_decode(truncated ids, skip_special_tokens=True)``, from which
        the ids cannot be recovered: keep, for this call, each such text's training ids."""
        if not isinstance(inputs, (list, tuple)) or not all(isinstance(x, dict) and "prompt" in x for x in inputs):
            return
        from trl.data_utils import maybe_apply_chat_template

        pairs = []
        for example in inputs:
            ids = self.training_ids(maybe_apply_chat_template(example, self.trainer.processing_class)["prompt"])
            pairs.append((self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False),
                          ids))
        accelerator = getattr(self.trainer, "accelerator", None)
        if getattr(self.trainer, "vllm_mode", None) == "server" and getattr(accelerator, "num_processes", 1) > 1:
            # the main process sends every process's prompts to the server; every process runs
            # this method, so all of them take part in the gather
            from accelerate.utils import gather_object

            pairs = gather_object(pairs)
        for text, ids in pairs:
            if text in self.lossy and self.lossy[text] != ids:
                self.lossy[text] = None  # two prompts that differ only in special tokens
            else:
                self.lossy.setdefault(text, ids)

    def target_ids(self, text: str) -> Optional[list]:
        """The ids vLLM must run for ``text`` under the fixes in force; None: leave it as it is."""
        fixes = self.fixes
        base = None
        if SPECIAL_TOKENS in fixes and text in self.lossy:
            base = self.lossy[text]
            if base is None:
                self._warn_once("ambiguous", "vllm-prompt-special-tokens: two prompts of this batch differ only in "
                                "special tokens; their vLLM prompt is left as TRL wrote it")
        if base is None:
            base = self.encode(text, special=False)
        limit = getattr(self.trainer, "max_prompt_length", None)
        if TRUNCATION in fixes and limit is not None and len(base) > limit:
            base = base[-limit:]
        if DOUBLE_BOS in fixes:
            target = base
        else:  # what vLLM adds to the text stays: that is vllm-double-bos's to correct
            added = self.added_by_vllm(text)
            if added is None:
                return None
            target = added[0] + base + added[1]
        return None if target == self.encode(text, special=True) else target

    def correct_all(self, prompts: Any, as_ids: bool) -> Any:
        if isinstance(prompts, str):
            return self.correct_all([prompts], as_ids)[0]
        if not isinstance(prompts, Sequence):
            return prompts
        out = []
        for prompt in prompts:
            target = self.target_ids(prompt) if isinstance(prompt, str) else None
            if target is None:
                out.append(prompt)
            elif as_ids:
                out.append({"prompt_token_ids": target})
            else:
                out.append(self.as_server_text(target))
        return out

    def as_server_text(self, target: list) -> str:
        """A text the server's tokenisation (special tokens added) turns into ``target``: the ids
        decoded with their special tokens, less those the server's tokenizer adds itself."""
        text = self.tokenizer.decode(target, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        added = self.added_by_vllm(text)
        if added is not None:
            before, after = added
            if target[:len(before)] == before and (not after or target[-len(after):] == after):
                body = target[len(before):len(target) - len(after)]
                text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.encode(text, special=True) != target:
            self._warn_once("server", "the vLLM server takes prompts as text, and no text gives back the training "
                            "prompt's ids with this tokenizer (e.g. training ids without the BOS the tokenizer adds); "
                            "the closest text is sent")
        return text

    @staticmethod
    def _warn_once(key: str, message: str) -> None:
        if key not in _WARNED:
            _WARNED.add(key)
            log.warning("trl_compat: %s", message)


_ABSENT = object()
_WARNED: set = set()  # once per process, not once per step
