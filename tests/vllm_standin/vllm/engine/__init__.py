"""Stand-in for ``vllm.engine``: the engine choice and the V0 ``LLMEngine``."""
