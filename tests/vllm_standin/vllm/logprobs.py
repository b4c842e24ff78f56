"""Stand-in for ``vllm.logprobs`` (vLLM >= 0.11; ``vllm.sequence`` before): ``Logprob``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Logprob:
    """One entry of ``CompletionOutput.logprobs[i]`` (a ``{token_id: Logprob}`` dict per generated token).

    ``rank``: 1 + the number of tokens of the vocabulary scored strictly higher (1 = the argmax)."""

    logprob: float
    rank: Optional[int] = None
    decoded_token: Optional[str] = None
