"""The corrections in force for one call of GRPOTrainer's generation method: the trainer's vLLM
entry points wrapped on the instance, and each text prompt turned into the ids training uses
(or, for the server, a text that tokenises back to them), for the fixes applied."""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from trl_compat._engine import warn_once

log = logging.getLogger(__name__)
_ABSENT = object()

TRUNCATION = "vllm-prompt-truncation"
SPECIAL_TOKENS = "vllm-prompt-special-tokens"
DOUBLE_BOS = "vllm-double-bos"


class Handoff:
    """The corrections in force for one call of the generation method of one trainer."""

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer
        self.fixes: list[str] = []
        self.lossy: dict[str, list | None] = {}  # 0.19.0's decoded text -> training ids (None: ambiguous)
        self._undo: list[Any] = []

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
            if full[start : start + len(plain)] == plain:
                return full[:start], full[start + len(plain) :]
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
            pairs.append((self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False), ids))
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

    def target_ids(self, text: str) -> list | None:
        """The ids vLLM must run for ``text`` under the fixes in force; None: leave it as it is."""
        fixes = self.fixes
        base = None
        if SPECIAL_TOKENS in fixes and text in self.lossy:
            base = self.lossy[text]
            if base is None:
                warn_once(
                    log,
                    "ambiguous",
                    "trl_compat: vllm-prompt-special-tokens: two prompts of this batch "
                    "differ only in special tokens; their vLLM prompt is left as TRL wrote it",
                )
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
            if target[: len(before)] == before and (not after or target[-len(after) :] == after):
                body = target[len(before) : len(target) - len(after)]
                text = self.tokenizer.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if self.encode(text, special=True) != target:
            warn_once(
                log,
                "server",
                "trl_compat: the vLLM server takes prompts as text, and no text gives back "
                "the training prompt's ids with this tokenizer (e.g. training ids without the BOS the tokenizer "
                "adds); the closest text is sent",
            )
        return text
