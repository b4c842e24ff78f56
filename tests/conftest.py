import os

import pytest

from unpatched import without_patch

# No test may reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@pytest.fixture
def unpatched():
    """``with unpatched("patch-id"): ...`` runs the block without that patch."""
    return without_patch


# vLLM >= 0.8 (and the stand-in installed as vLLM 0.8.5 / 0.9.1) writes its engine choice into
# os.environ when building an engine, and the vllm-v1-engine patch leaves its VLLM_USE_V1=0 set:
# without this, which engine a test gets, and what a `python -m trl_compat` subprocess reports,
# would depend on the tests that ran before it.
VLLM_ENGINE_VARS = ("VLLM_USE_V1", "VLLM_ENABLE_V1_MULTIPROCESSING")


@pytest.fixture(autouse=True)
def _vllm_engine_choice_per_test():
    saved = {name: os.environ.get(name) for name in VLLM_ENGINE_VARS}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
