"""Stand-in for ``vllm.v1.engine``."""
