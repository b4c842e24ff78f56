"""Stand-in for ``vllm.distributed.weight_transfer.nccl_common``: the trainer's rendezvous."""

from ._recorder import TrainerGroup

_INIT_KEYS = ("master_address", "master_port", "rank_offset", "world_size")


def trainer_init(init_info):
    """Joins the weight-transfer group as rank 0; returns the (recording) group."""
    info = dict(init_info)
    missing = [key for key in _INIT_KEYS if key not in info]
    if missing:
        raise KeyError(f"init_info lacks {missing}")
    return TrainerGroup(info)
