import contextlib
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)  # tests import their helpers (tiny, grpo_run) by name

# No test may reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@contextlib.contextmanager
def without_patch(patch_id):
    """Run a block on the unpatched code, then put the patch back.

    The patch must have been applied before (tests assert that first), so the
    block really exercises the code trl_compat replaces."""
    import trl_compat

    assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()
    trl_compat.revert(patch_id)
    try:
        yield
    finally:
        trl_compat.install(patch_id)
        assert trl_compat.status(patch_id) == trl_compat.APPLIED, trl_compat.report()


@pytest.fixture
def unpatched():
    """``with unpatched("patch-id"): ...`` runs the block without that patch."""
    return without_patch
