"""transformers5-import: TRL < 0.29 on transformers >= 5.3 must not think every optional package is installed.

The bug
    ``trl/import_utils.py`` asks transformers' private helper
    ``transformers.utils.import_utils._is_package_available`` whether each optional package is
    installed. Up to transformers 5.2 that helper returned a bool unless asked for the version;
    from transformers 5.3 it always returns a tuple ``(exists, version)``. ``(False, None)`` is
    truthy, so every ``is_*_available()`` says yes and the guarded imports run:
    ``from trl import GRPOTrainer`` dies with ``ModuleNotFoundError: No module named 'requests'``
    (``trl/extras/vllm_client.py``, where requests is missing), then ``'vllm'`` (TRL 0.22.2 on
    transformers 5.5.0), ``'weave'`` (``trl/trainer/callbacks.py``, TRL 0.24 - 0.28, e.g. 0.26.1 on
    5.5.4), ``'mergekit'``, ``'llm_blender'`` ... depending on what is installed.
    TRL 0.14.0 - 0.26.x cache the flags at import time (``_deepspeed_available =
    _is_package_available("deepspeed")``; 0.24 added math_verify and weave, 0.26 jmespath as
    ``_is_jmespath_available``); TRL 0.27.0 - 0.28.x call the helper inside each
    ``is_*_available()`` instead. Upstream: TRL PR #5129 (0.29.0) replaced the import by its own
    helper. Affected: TRL 0.14.0 - 0.28.x (and the 0.29.0.dev0 builds before #5129) on
    transformers >= 5.3.

How the probe recognises it
    It looks at the real values: module globals named ``_*_available`` of the loaded
    ``trl.import_utils`` that are tuples ``(bool, ...)`` (the cached flags), and whether the
    module's ``_is_package_available`` is transformers' helper and answers a tuple when not asked
    for the version (the lazy calls). Either means the bug is there; all flags bools and a helper
    that answers bools (transformers < 5.3) or TRL's own helper (0.29+) mean not needed.

The fix
    Each tuple flag is replaced by ``bool(flag[0])`` in ``trl.import_utils`` (the
    ``is_*_available()`` functions read those globals at call time), and the module's
    ``_is_package_available`` is wrapped so that a call without ``return_version`` (bound by name)
    answers the bool, as transformers < 5.3 did; with ``return_version=True`` it answers the pair,
    as TRL expects. transformers' own helper is left alone. The trigger is
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
loaded.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.29 on transformers >= 5.3 (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed

HELPER = "_is_package_available"
TRANSFORMERS_HELPER_MODULE = "transformers.utils.import_utils"


def tuple_flags(module) -> dict:
    """``name -> value`` for the ``_*_available`` globals of ``module`` that hold ``(bool, ...)`` tuples."""
    return {
        name: value
        for name, value in vars(module).items()
        if name.startswith("_") and name.endswith("_available") and isinstance(value, tuple) and value and isinstance(value[0], bool)
    }


def helper_answers_tuples(module) -> bool:
    """Whether ``module._is_package_available`` is transformers' helper and answers ``(exists, version)``
    when not asked for the version (transformers >= 5.3)."""
    helper = getattr(module, HELPER, None)
    if helper is None or getattr(helper, "__module__", None) != TRANSFORMERS_HELPER_MODULE:
        return False  # TRL 0.29+'s own helper, or none
    return isinstance(helper("trl"), tuple)


def probe(module):
    flags = tuple_flags(module)
    lazy = helper_answers_tuples(module)
    if not flags and not lazy:
        return not_needed("trl.import_utils' _*_available flags are bools and its package check answers bools")
    found = []
    if flags:
        shown = ", ".join(f"{name}={value!r}" for name, value in sorted(flags.items()))
        found.append(f"caches transformers' (exists, version) tuples, all truthy: {shown}")
    if lazy:
        found.append("calls transformers' _is_package_available, which answers (exists, version) tuples, all truthy")
    return needed("trl.import_utils " + "; ".join(found))


def bools_unless_version(helper):
    """``helper`` answering ``bool(exists)`` when called without ``return_version``."""
    signature = inspect.signature(helper)

    @functools.wraps(helper)
    def _is_package_available(*args, **kwargs):
        result = helper(*args, **kwargs)
        try:
            wants_version = signature.bind(*args, **kwargs).arguments.get("return_version", False)
        except TypeError:
            return result
        if not wants_version and isinstance(result, tuple) and result:
            return bool(result[0])
        return result

    return _is_package_available


def apply(module, patcher):
    for name, value in tuple_flags(module).items():
        patcher.replace(module, name, bool(value[0]))
    if helper_answers_tuples(module):
        patcher.wrap(module, HELPER, bools_unless_version)
