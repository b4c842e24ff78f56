"""Stand-in for ``vllm.distributed.weight_transfer.nccl_engine`` (see ``__init__.py``): the static
trainer API up to vLLM 0.27.x; from 0.28.0 the class has no ``trainer_init`` / ``trainer_send_weights``."""

from dataclasses import dataclass
from typing import Any

from ...sampling_params import _installed_version
from . import nccl_common, packed_tensor


@dataclass
class NCCLTrainerSendWeightsArgs:
    group: Any
    src: int = 0
    packed: bool = False


class NCCLWeightTransferEngine:
    """The engine's worker side (the server's) is not imitated: constructing it raises."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: the worker side of NCCL weight transfer is not provided")

    if _installed_version() < (0, 28):

        @staticmethod
        def trainer_init(init_info):
            return nccl_common.trainer_init(init_info)

        @staticmethod
        def trainer_send_weights(iterator, trainer_args):
            packed_tensor.packed_nccl_broadcast_producer(iterator=iterator, group=trainer_args.group, src=trainer_args.src)
