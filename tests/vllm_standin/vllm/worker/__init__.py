"""Stand-in for ``vllm.worker``."""
