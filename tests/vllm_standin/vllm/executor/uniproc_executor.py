"""Stand-in for vLLM's single-process executor: the driver worker lives in this process."""

from __future__ import annotations

from typing import Any


class UniProcExecutor:
    """``llm_engine.model_executor``: ``.driver_worker.model_runner.model`` is the loaded model."""

    def __init__(self, driver_worker: Any):
        self.driver_worker = driver_worker
