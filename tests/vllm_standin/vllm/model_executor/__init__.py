"""Stand-in for ``vllm.model_executor`` (see ``models.py``)."""
