"""Stand-in for ``vllm.distributed.weight_transfer.nccl_common``: the trainer's rendezvous and the
init info the server parses (``packed`` and the buffer geometry from 0.28.0, default unpacked)."""

from dataclasses import dataclass

from ...sampling_params import _installed_version
from ._recorder import TrainerGroup
from .packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES, DEFAULT_PACKED_NUM_BUFFERS

_INIT_KEYS = ("master_address", "master_port", "rank_offset", "world_size")

if _installed_version() >= (0, 28):

    @dataclass
    class NCCLWeightTransferInitInfo:
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int
        packed: bool = False
        packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
        packed_num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS

else:

    @dataclass
    class NCCLWeightTransferInitInfo:
        master_address: str
        master_port: int
        rank_offset: int
        world_size: int


def trainer_init(init_info):
    """Joins the weight-transfer group as rank 0; returns the (recording) group."""
    info = dict(init_info) if isinstance(init_info, dict) else vars(init_info)
    missing = [key for key in _INIT_KEYS if key not in info]
    if missing:
        raise KeyError(f"init_info lacks {missing}")
    return TrainerGroup(info)
