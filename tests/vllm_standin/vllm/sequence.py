"""Stand-in for ``vllm.sequence``: where vLLM <= 0.10 defines ``Logprob`` (re-exported here)."""

from .logprobs import Logprob

__all__ = ["Logprob"]
