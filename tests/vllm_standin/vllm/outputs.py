"""Stand-in for ``vllm.outputs`` (vLLM 0.7.2 ``RequestOutput`` / ``CompletionOutput`` fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list  # includes the EOS / stop token when generation stopped on one (as vLLM does)
    cumulative_logprob: Optional[float] = None
    logprobs: Optional[Any] = None
    finish_reason: Optional[str] = None  # "stop" | "length"
    stop_reason: Any = None  # None for EOS, else the stop token id
    lora_request: Any = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: Optional[str]
    prompt_token_ids: Optional[list]
    prompt_logprobs: Optional[Any]
    outputs: list
    finished: bool
    metrics: Any = None
    lora_request: Any = None
    encoder_prompt: Optional[str] = None
    encoder_prompt_token_ids: Optional[list] = None
    num_cached_tokens: Optional[int] = None
