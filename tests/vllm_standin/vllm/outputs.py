"""Stand-in for ``vllm.outputs`` (vLLM 0.7.2 ``RequestOutput`` / ``CompletionOutput`` fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list  # includes the EOS / stop token when generation stopped on one (as vLLM does)
    cumulative_logprob: float | None = None
    logprobs: Any | None = None
    finish_reason: str | None = None  # "stop" | "length"
    stop_reason: Any = None  # None for EOS, else the stop token id
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list | None
    prompt_logprobs: Any | None
    outputs: list
    finished: bool
    metrics: Any = None
    lora_request: Any = None
    encoder_prompt: str | None = None
    encoder_prompt_token_ids: list | None = None
    num_cached_tokens: int | None = None
