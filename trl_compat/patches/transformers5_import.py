"""transformers5-import: TRL <= 0.19 on transformers 5 must not think every optional package is installed.

The bug
    ``trl/import_utils.py`` caches ``_deepspeed_available = _is_package_available("deepspeed")``
    (and the same for diffusers, fastapi, llm_blender, mergekit, pydantic, requests, unsloth,
    uvicorn, vllm, vllm_ascend, joblib, ...), using transformers' private helper
    ``transformers.utils.import_utils._is_package_available``. Up to transformers 4.x that helper
    returned a bool unless asked for the version; transformers 5 always returns a tuple
    ``(exists, version)``. ``(False, None)`` is truthy, so every ``is_*_available()`` says yes and
    the guarded imports run: ``from trl import GRPOTrainer`` dies with
    ``ModuleNotFoundError: No module named 'requests'`` (``trl/extras/vllm_client.py``), or
    'vllm' / 'mergekit' / 'llm_blender' ... depending on what is installed.
    Upstream: TRL PR #5129 (0.29.0) replaced the import by its own helper. Every TRL release from
    0.14.0 to 0.26.x caches the flags at import time like this (0.27/0.28 call the helper lazily
    inside ``is_*_available()``, which this patch does not cover); the window here is the range
    trl_compat supports and tests, trl < 0.20, with the 0.20.0.dev0 main-branch builds (which
    have the bug too).

How the probe recognises it
    It looks at the real values: module globals named ``_*_available`` of the loaded
    ``trl.import_utils`` that are tuples ``(bool, ...)``. Any such flag means the bug is there;
    all flags bools means not needed.

The fix
    Each tuple flag is replaced by ``bool(flag[0])`` in ``trl.import_utils`` (the
    ``is_*_available()`` functions read those globals at call time). The trigger is
    ``trl.import_utils`` itself: with ``import trl_compat`` first, the flags are fixed right after
    that module runs, before ``trl/__init__`` or any trainer module reads them. With ``import trl``
    first, they are fixed when trl_compat is imported; a ``from trl import GRPOTrainer`` that
    already failed then works when retried (Python drops the modules whose import failed), but
    ``trl``'s lazy export table keeps names it added for optional packages it thought present
    (e.g. the diffusers-only ``DDPOTrainer``): those fail with a ModuleNotFoundError when used,
    as they would without the package anyway.

Why a separate patch from transformers5-use-cache and transformers5-warnings-issued: the
triggers differ. This one must fire on ``trl.import_utils`` before ``trl.trainer.grpo_trainer``
can even be imported; the others change what ``GRPOTrainer.__init__`` uses after that module has
loaded. The three share their window (``TRANSFORMERS5`` in ``trl_compat/patches/__init__.py``).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed


def tuple_flags(module) -> dict:
    """``name -> value`` for the ``_*_available`` globals of ``module`` that hold ``(bool, ...)`` tuples."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple) and value and isinstance(value[0], bool)
    }


def probe(module):
    flags = tuple_flags(module)
    if not flags:
        return not_needed("trl.import_utils' _*_available flags are bools")
    shown = ", ".join(f"{name}={value!r}" for name, value in sorted(flags.items()))
    return needed(f"trl.import_utils caches transformers 5's (exists, version) tuples, all truthy: {shown}")


def apply(module, patcher):
    for name, value in tuple_flags(module).items():
        patcher.replace(module, name, bool(value[0]))
