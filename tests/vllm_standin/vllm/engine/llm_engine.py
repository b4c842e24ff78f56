"""Stand-in for ``vllm.engine.llm_engine``: the V0 ``LLMEngine``, executor and driver worker in the
training process (what TRL 0.14 / 0.15's weight sync reaches through ``model_executor``).

``LLMEngine.from_engine_args`` builds this class or, where vLLM >= 0.8 picks V1 (see
``arg_utils.py``), ``vllm.v1.engine.llm_engine.LLMEngine``, as vLLM 0.8.x does.
"""

from __future__ import annotations

from typing import Any

from ..executor.uniproc_executor import UniProcExecutor
from .arg_utils import use_v1_engine


class LLMEngine:
    """The V0 engine: ``model_executor.driver_worker.model_runner.model`` is the loaded model."""

    def __init__(self, worker: Any, model_config: Any, tokenizer: Any) -> None:
        self.model_config = model_config
        self.tokenizer = tokenizer
        self.model_executor = UniProcExecutor(worker)
        # V0 profiles memory while sizing the KV cache (TRL 0.14/0.15 patch the check it runs)
        self.model_executor.driver_worker.determine_num_available_blocks()

    @classmethod
    def from_engine_args(cls, engine_args: Any) -> Any:
        """``engine_args``: ``worker``, ``model_config`` (``dtype`` resolved), ``tokenizer`` and
        ``distributed_executor_backend``."""
        if use_v1_engine(engine_args.model_config.dtype, engine_args.distributed_executor_backend):
            from ..v1.engine.llm_engine import LLMEngine as V1LLMEngine

            return V1LLMEngine.from_engine_args(engine_args)
        return cls(engine_args.worker, engine_args.model_config, engine_args.tokenizer)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def get_model_config(self) -> Any:
        return self.model_config
