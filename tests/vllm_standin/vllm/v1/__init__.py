"""Stand-in for ``vllm.v1`` (vLLM >= 0.8's default engine)."""
