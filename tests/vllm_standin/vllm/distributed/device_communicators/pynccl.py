"""Import-only placeholder for ``vllm.distributed.device_communicators.pynccl``."""


class PyNcclCommunicator:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: PyNcclCommunicator (vLLM server weight sync) is not provided")
