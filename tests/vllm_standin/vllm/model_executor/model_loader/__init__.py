"""Stand-in for ``vllm.model_executor.model_loader`` (import-only; TRL >= 0.26's ``trl/__init__.py`` patches it)."""
