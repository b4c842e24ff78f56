"""What the guard's tests in real GRPO runs share: the skip of a cell where a run means nothing."""

from __future__ import annotations

import importlib.util
from typing import Callable

import pytest

HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


def vllm_run_or_skip(versions: Callable[[tuple[int, ...]], bool] | None = None, patch_id: str | None = None) -> tuple[int, ...]:
    """Skip unless a GRPO run with vLLM (the stand-in or a real engine) can run here, the installed
    TRL's (major, minor) passes ``versions`` and the patch ``patch_id`` applies in this cell.
    Returns TRL's (major, minor)."""
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl_compat

    import trl.trainer.grpo_trainer  # noqa: F401  (the patches' trigger)

    import grpo_run

    version = grpo_run.trl_version()[:2]
    if versions is not None and not versions(version):
        pytest.skip(f"not this TRL ({version})")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    if patch_id is not None and trl_compat.status(patch_id) != trl_compat.APPLIED:
        pytest.skip(f"{patch_id} does not apply in this cell")
    return version
