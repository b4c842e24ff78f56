"""Stand-in for ``vllm.sampling_params`` (vLLM 0.7.2 field names and defaults).

Unknown keyword arguments raise ``TypeError`` (as vLLM's msgspec struct does). Fields the stand-in
cannot honour when generating (``prompt_logprobs``, ``stop`` strings, ``guided_decoding``,
``logits_processors``, ``best_of`` > n, penalties other than ``repetition_penalty``, ...) are accepted
here and rejected with ``NotImplementedError`` by ``LLM.generate``.

Its layout follows the installed version (the stand-in's distribution version): from 0.11.0
``SamplingParams`` also takes ``structured_outputs=`` (vLLM PR #22772; TRL 0.27 passes it for
vLLM > 0.10.2); from 0.12.0 ``GuidedDecodingParams`` is gone and ``guided_decoding=`` is an
unknown keyword (vLLM PR #29326, "scheduled removal of guided_*"), so TRL 0.18 - 0.26's
``from vllm.sampling_params import GuidedDecodingParams`` fails as it does on vLLM 0.12.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import re
from dataclasses import dataclass
from typing import Any


def _installed_version() -> tuple:
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:  # imported from the source tree
        version = "0.7.2"
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


STRUCTURED_OUTPUTS = _installed_version() >= (0, 11)  # SamplingParams(structured_outputs=...)
GUIDED_DECODING = _installed_version() < (0, 12)  # GuidedDecodingParams, SamplingParams(guided_decoding=...)


if GUIDED_DECODING:

    @dataclass
    class GuidedDecodingParams:
        """Placeholder with vLLM 0.7.2's fields; guided decoding itself is not implemented."""

        json: str | dict | None = None
        regex: str | None = None
        choice: list | None = None
        grammar: str | None = None
        json_object: bool | None = None
        backend: str | None = None
        whitespace_pattern: str | None = None


@dataclass
class StructuredOutputsParams:
    """Placeholder for the newer (vLLM >= 0.11) name, so newer TRL can import it; not implemented."""

    json: str | dict | None = None
    regex: str | None = None
    choice: list | None = None
    grammar: str | None = None
    json_object: bool | None = None


@dataclass
class SamplingParams:
    n: int = 1
    best_of: int | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: str | list | None = None
    stop_token_ids: list | None = None
    bad_words: list | None = None
    ignore_eos: bool = False
    max_tokens: int | None = 16
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    detokenize: bool = True
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    logits_processors: Any | None = None
    include_stop_str_in_output: bool = False
    truncate_prompt_tokens: int | None = None
    output_kind: Any = None
    if GUIDED_DECODING:
        guided_decoding: Any | None = None
    if STRUCTURED_OUTPUTS:
        structured_outputs: StructuredOutputsParams | None = None
    logit_bias: dict | None = None
    allowed_token_ids: list | None = None

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be at least 1, got {self.n}.")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}.")
        if self.top_k == 0 and _installed_version() >= (0, 10):
            # newer vLLM reads 0 as "disabled", like -1 (vLLM #17553; checked here from 0.10, the
            # release TRL 0.28's default top_k=0 meets first; the exact vLLM release is not checked)
            self.top_k = -1
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disable), or at least 1, got {self.top_k}.")
        if self.logprobs is not None and self.logprobs < 0:
            raise ValueError(f"logprobs must be non-negative, got {self.logprobs}.")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}.")
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        else:
            self.stop_token_ids = list(self.stop_token_ids)

    def clone(self) -> SamplingParams:
        return dataclasses.replace(self)

    # Fields the stand-in's generate() cannot honour when set to a non-default value.
    def unsupported_fields(self) -> list[str]:
        bad = []
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for name in (
            "presence_penalty",
            "frequency_penalty",
            "stop",
            "bad_words",
            "prompt_logprobs",
            "logits_processors",
            "guided_decoding",
            "structured_outputs",
            "logit_bias",
            "allowed_token_ids",
        ):
            if name in defaults and getattr(self, name) != defaults[name]:  # a field this version lacks
                bad.append(name)
        if self.best_of is not None and self.best_of != self.n:
            bad.append("best_of")
        return bad
