"""Import-only placeholder for ``vllm.distributed.parallel_state`` (``trl vllm-serve`` imports
``get_world_group`` at module import time from TRL 0.19 on)."""


def get_world_group(*args, **kwargs):
    raise NotImplementedError("vllm stand-in: get_world_group is not provided")
