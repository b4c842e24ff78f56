"""The GPU suite: trl_compat on CUDA in bf16 (issue 41; matrix/README.md, "On a GPU").

Every test here is marked ``gpu`` and skipped without CUDA, so the matrix's CPU cells collect and skip
it. ``TRL_COMPAT_GPU_DRY_RUN=1`` runs it on the CPU in float32 instead (tools/gpu_check/run.sh
--cpu-dry-run): the same code, known to work before a GPU is lent.
"""

import importlib.util
import os

import pytest

DRY_RUN = os.environ.get("TRL_COMPAT_GPU_DRY_RUN", "") == "1"
HERE = os.path.dirname(os.path.abspath(__file__))


def cuda_available():
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: the GPU suite (tests/gpu): skipped without CUDA unless TRL_COMPAT_GPU_DRY_RUN=1")


def pytest_collection_modifyitems(config, items):
    ours = [item for item in items if str(item.path).startswith(HERE + os.sep)]
    if not ours:
        return
    skip = None
    if importlib.util.find_spec("torch") is None or importlib.util.find_spec("trl") is None:
        skip = pytest.mark.skip(reason="the GPU suite needs torch and TRL")
    elif not DRY_RUN and not cuda_available():
        skip = pytest.mark.skip(reason="no CUDA (TRL_COMPAT_GPU_DRY_RUN=1 runs the suite on the CPU)")
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device():
    """(device, dtype) the suite computes in: CUDA and bf16, or the CPU and float32 in a dry run."""
    import torch

    if DRY_RUN:
        return torch.device("cpu"), torch.float32
    return torch.device("cuda"), torch.bfloat16
