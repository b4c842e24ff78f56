"""Stand-in for ``vllm.transformers_utils`` (import-only)."""
