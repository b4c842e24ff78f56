"""Import-only placeholders (TRL 1.x imports these when a vLLM < 0.28 is installed)."""


class NCCLTrainerSendWeightsArgs:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: NCCL weight transfer is not provided")


class NCCLWeightTransferEngine:
    def __init__(self, *args, **kwargs):
        raise NotImplementedError("vllm stand-in: NCCL weight transfer is not provided")

    @staticmethod
    def trainer_init(*args, **kwargs):
        raise NotImplementedError("vllm stand-in: NCCL weight transfer is not provided")

    @staticmethod
    def trainer_send_weights(*args, **kwargs):
        raise NotImplementedError("vllm stand-in: NCCL weight transfer is not provided")
