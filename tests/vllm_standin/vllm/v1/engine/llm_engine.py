"""Stand-in for ``vllm.v1.engine.llm_engine``: vLLM >= 0.8's V1 ``LLMEngine``.

V1 runs the model in an engine core that, by default (``VLLM_ENABLE_V1_MULTIPROCESSING=1``), is a
separate process: the engine in the caller's process has no ``model_executor`` at all, so TRL 0.14 /
0.15's ``llm.llm_engine.model_executor...`` raises ``AttributeError: 'LLMEngine' object has no
attribute 'model_executor'`` (TRL issue #3115). With the engine core in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, which ``external_launcher`` sets) vLLM 0.8.x exposes the
core's executor as ``model_executor`` for V0 compatibility (TRL 0.18 / 0.19's colocate mode reaches it).

The stand-in's ``LLM`` still generates with the model it loaded (what the engine core would run);
only what the engine object exposes follows V1.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from ... import envs
from ...executor.uniproc_executor import UniProcExecutor


class SyncMPClient:
    """The client of an engine core in another process: nothing of the model is reachable here."""

    def __init__(self, executor: Any):
        del executor  # lives in the engine core's process


class InprocClient:
    """The engine core in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``)."""

    def __init__(self, executor: Any):
        self.engine_core = SimpleNamespace(model_executor=executor)


class LLMEngine:
    """vLLM 0.8.x's V1 ``LLMEngine`` ("legacy LLMEngine for backwards compatibility")."""

    def __init__(self, worker: Any, model_config: Any, tokenizer: Any, multiprocess_mode: bool) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        executor = UniProcExecutor(worker)
        if multiprocess_mode:
            self.engine_core = SyncMPClient(executor)
        else:
            self.engine_core = InprocClient(executor)
            self.model_executor = self.engine_core.engine_core.model_executor

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> LLMEngine:
        return cls(
            engine_args.worker, engine_args.model_config, engine_args.tokenizer, multiprocess_mode=envs.VLLM_ENABLE_V1_MULTIPROCESSING
        )

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_model_config(self) -> Any:
        return self.model_config
