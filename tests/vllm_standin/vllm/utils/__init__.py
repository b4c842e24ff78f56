"""Stand-in for ``vllm.utils`` (only what TRL imports)."""
