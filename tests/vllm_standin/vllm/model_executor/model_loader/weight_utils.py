"""Stand-in for ``vllm.model_executor.model_loader.weight_utils``: TRL 0.26 - 0.29's ``import trl``
replaces ``DisabledTqdm`` here (a vLLM < 0.11.1 bug); the stand-in's loader never uses it."""

from tqdm.auto import tqdm


class DisabledTqdm(tqdm):
    def __init__(self, *args, **kwargs):
        kwargs["disable"] = True
        super().__init__(*args, **kwargs)
