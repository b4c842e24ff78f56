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


def v1_by_default() -> bool:
    """vLLM 0.8.0 made V1 the default engine; below that the stand-in is V0 only."""
    from .. import __version__

    return tuple(int(part) for part in re.findall(r"\d+", __version__)[:2]) >= (0, 8)


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
