"""Stand-in for ``vllm.logprobs`` (vLLM >= 0.11; ``vllm.sequence`` before): ``Logprob``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Logprob:
    """One entry of ``CompletionOutput.logprobs[i]`` (a ``{token_id: Logprob}`` dict per generated token).

    ``rank``: 1 + the number of tokens of the vocabulary scored strictly higher (1 = the argmax)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None
