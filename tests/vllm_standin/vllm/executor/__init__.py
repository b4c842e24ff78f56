"""Stand-in for ``vllm.executor``."""
