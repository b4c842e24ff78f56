"""Stand-in for ``vllm.worker.worker`` (the attribute path TRL 0.14/0.15 reach and patch)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Callable


class ModelRunner:
    """``llm.llm_engine.model_executor.driver_worker.model_runner``: holds ``.model``."""

    def __init__(self, model: Any, load_checkpoint: Callable[[], Iterable] | None = None):
        self.model = model
        self._load_checkpoint = load_checkpoint

    def reload_weights(self) -> None:
        """vLLM's ``GPUModelRunner.reload_weights``: the model loader reads the checkpoint the engine was
        built from again and feeds it through ``model.load_weights`` (not recorded as a sync here)."""
        recording, self.model._recording = self.model._recording, False
        try:
            self.model.load_weights(self._load_checkpoint())
        finally:
            self.model._recording = recording


class Worker:
    """TRL 0.14/0.15 patch ``Worker._assert_memory_footprint_increased_during_profiling`` while
    building ``LLM``; the stand-in calls it from ``determine_num_available_blocks`` like vLLM does,
    but the unpatched method is a no-op here (there is no GPU memory to profile)."""

    def __init__(self, model_runner: ModelRunner, device: str = "cpu"):
        self.model_runner = model_runner
        self.device = device
        self.memory_profiling_checks = 0

    def _assert_memory_footprint_increased_during_profiling(self) -> None:
        self.memory_profiling_checks += 1

    def reload_weights(self) -> None:
        """V1 ``gpu_worker.Worker.reload_weights`` (what ``llm.collective_rpc("reload_weights")`` runs)."""
        self.model_runner.reload_weights()

    def determine_num_available_blocks(self) -> tuple[int, int]:
        self._assert_memory_footprint_increased_during_profiling()
        return (0, 0)
