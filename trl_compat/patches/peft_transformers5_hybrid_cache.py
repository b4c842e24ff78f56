"""peft-transformers5-hybrid-cache: peft < 0.18 cannot be imported on transformers 5 (advice only).

The bug
    peft 0.17.x's ``peft/peft_model.py`` does ``from transformers import ..., HybridCache, ...``
    (read in the 0.17.1 wheel). transformers 5 removed ``HybridCache`` (transformers PR #43168),
    so ``import peft``, and with it ``from trl import GRPOTrainer`` (TRL imports peft whenever it
    is installed), dies with ``ImportError: cannot import name 'HybridCache' from
    'transformers'``, whether or not the run uses LoRA.
    Upstream: peft PR #2735 (fixed in peft 0.18.0). TRL added its own shim in 0.27.0
    (``trl/_compat.py: _patch_transformers_hybrid_cache``, PRs #4798/#4820), which reached peft
    only with PR #4844 (0.28.0): TRL 0.14.0 - 0.27.x meet it on transformers 5 with peft < 0.18.
    The window's peft floor is the oldest peft any TRL of trl_compat's range accepts (0.8.0).
    Run on transformers 5.23.0 with peft 0.17.1 (CPU, a throwaway venv): ``import peft`` fails;
    so do ``from trl import GRPOTrainer`` on TRL 0.19.1 and ``import peft`` after ``import trl``
    on TRL 0.27.2; after ``import trl`` 0.28.0, peft 0.17.1 imports; peft 0.18.0 imports alone.

How the probe decides
    The gate finds TRL, transformers and peft in their windows. transformers builds that still
    define ``transformers.cache_utils.HybridCache`` (5.0.0.dev0 before PR #43168) do not break
    peft: "not needed" there; otherwise "undecided" with the upgrade. peft itself is not imported
    (that import is the crash).

Why no fix
    TRL's shim aliases ``HybridCache`` to ``Cache`` in ``transformers.cache_utils`` and patches
    transformers' ``_LazyModule.__init__`` to export it: it must run before peft is imported and
    gives peft a class that is not the one its Gemma-2/3 prefix-tuning code expects. Upgrading
    peft to 0.18.0, the first release for transformers 5, ends it for good. ``changes`` names the
    attributes TRL's shim sets.

Delete when: trl_compat no longer supports TRL < 0.28 on transformers 5 (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import not_needed
from trl_compat.patches._advice import advise, refusing_apply

ADVICE = "upgrade peft to 0.18.0 or newer (or pin transformers<5)"


def probe(module):
    import transformers.cache_utils

    if hasattr(transformers.cache_utils, "HybridCache"):
        return not_needed("transformers.cache_utils still defines HybridCache")
    return advise(
        "peft < 0.18 imports transformers.HybridCache, which transformers 5 removed "
        "(ImportError at `import peft`, so at `from trl import GRPOTrainer`)",
        ("peft", "transformers"),
        ADVICE,
    )


apply = refusing_apply("peft-transformers5-hybrid-cache")
