"""Import-only placeholder for ``vllm.distributed.utils``."""


class StatelessProcessGroup:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: StatelessProcessGroup is not provided")

    @staticmethod
    def create(*args, **kwargs):
        raise NotImplementedError("vllm stand-in: StatelessProcessGroup is not provided")
