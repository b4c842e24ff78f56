"""vllm-guided-decoding-import: with vLLM >= 0.12 installed, ``from trl import GRPOTrainer`` (and
``trl vllm-serve``) fails: ``ImportError: cannot import name 'GuidedDecodingParams'``.

The bug (TRL issue #4617: trl 0.25.0, vLLM 0.12.0): vLLM 0.12.0 removed ``GuidedDecodingParams``
and ``SamplingParams(guided_decoding=...)`` (vLLM PR #29326, "scheduled removal of guided_*"; 0.11
had renamed them ``StructuredOutputsParams`` / ``structured_outputs=``, vLLM PR #22772). TRL imports
the old name unconditionally whenever vLLM is installed: ``trl/scripts/vllm_serve.py`` from 0.16.0,
``trl/trainer/grpo_trainer.py`` from 0.18.0 (``from vllm.sampling_params import
GuidedDecodingParams``), so the import of the trainer module fails even with ``use_vllm=False``.
Past the import, TRL passes ``guided_decoding=<params or None>`` to every ``SamplingParams(...)`` it
builds (colocate generation, the server's /generate/ and /chat/), which vLLM 0.12 rejects
(``TypeError``: unexpected keyword argument). Fixed by TRL PR #4117 (reverted by #4791, re-applied
by #4797; commit 39ad00d2b), released in 0.27.0: it imports ``StructuredOutputsParams`` and passes
``structured_outputs=`` for vLLM > 0.10.2. Where it shows: TRL 0.16.0 - 0.26.2 (and main-branch builds up
to #4797) with vLLM >= 0.12.0. TRL's other modules with the same import (RLOO, online DPO,
experimental) get the name back too; only GRPO's and vllm-serve's ``SamplingParams`` are renamed.

Why the trigger is ``trl`` (the package): TRL's module imports the name while it is itself being
imported, so a hook on it would run too late, and a hook on ``vllm.sampling_params`` alone would
run while TRL's module is half executed, before it binds ``SamplingParams``. The ``trl`` package is
always imported before its submodules: from there the patch hooks ``vllm.sampling_params`` (it
adds the name as soon as vLLM's module is loaded, before TRL's import line runs) and TRL's two
modules (their ``SamplingParams`` global is wrapped once they are fully imported).

Probe: reads the source files of ``trl.trainer.grpo_trainer`` and ``trl.scripts.vllm_serve``
without importing them (``_helpers.source.module_code``): "needed" where one has ``from
vllm.sampling_params import GuidedDecodingParams`` and no ``StructuredOutputsParams`` (0.27+ has
both, version-gated). The vLLM side is the gate's (vLLM >= 0.12.0 installed); a vLLM whose
``vllm.sampling_params`` still has the name (a 0.12.0.dev0 build) is left alone when it loads.
"Undecided" when neither source file can be read.

Fix: once ``vllm.sampling_params`` is imported and lacks the name, it gets
``GuidedDecodingParams``: a function that builds ``StructuredOutputsParams`` from the same
keywords (``backend=``, which TRL 0.16 passes and ``StructuredOutputsParams`` does not take, is
dropped: vLLM 0.12 chooses the backend per engine). The ``SamplingParams`` global of each affected
TRL module is wrapped, when the installed ``SamplingParams`` takes no ``guided_decoding``, so that
``guided_decoding=`` reaches it as ``structured_outputs=``. Errors in these hooks are logged and
the import goes on (TRL then fails as it would without trl_compat); under TRL_COMPAT_STRICT=1 they
propagate.

Delete when: trl_compat no longer supports TRL < 0.27.0 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import logging

from trl_compat._engine import guarded, hooks, needed, not_needed, undecided
from trl_compat._engine.patch import SourceUnavailable
from trl_compat._helpers.source import module_code

log = logging.getLogger(__name__)

PATCH_ID = "vllm-guided-decoding-import"
SAMPLING_MODULE = "vllm.sampling_params"
# The modules whose SamplingParams(guided_decoding=...) calls GRPO training and `trl vllm-serve` make.
TRL_MODULES = ("trl.trainer.grpo_trainer", "trl.scripts.vllm_serve")
OLD_IMPORT = "from vllm.sampling_params import GuidedDecodingParams"


def importers() -> tuple[list[str], list[str]]:
    """The TRL modules that import ``GuidedDecodingParams`` unconditionally, and the reasons the
    others could not be read."""
    found, unreadable = [], []
    for name in TRL_MODULES:
        try:
            source = module_code(name)
        except ModuleNotFoundError:  # a release without it (vllm_serve came in 0.16): nothing imports the name
            continue
        except SourceUnavailable as exc:
            unreadable.append(str(exc))
            continue
        if OLD_IMPORT in source and "StructuredOutputsParams" not in source:
            found.append(name)
    return found, unreadable


def probe(module):
    found, unreadable = importers()
    if found:
        return needed(f"{', '.join(found)} import GuidedDecodingParams, which vLLM >= 0.12 removed")
    if len(unreadable) == len(TRL_MODULES):
        return undecided("; ".join(unreadable))
    return not_needed("TRL's GRPO trainer and vllm-serve do not import vLLM's removed GuidedDecodingParams")


def guided_decoding_params(structured_outputs_params):
    """``GuidedDecodingParams(**kwargs)`` as vLLM < 0.12 took it, built as ``StructuredOutputsParams``."""

    def GuidedDecodingParams(*args, **kwargs):
        backend = kwargs.pop("backend", None)
        if backend is not None:
            log.debug("trl_compat: %s: GuidedDecodingParams(backend=%r) dropped: vLLM >= 0.12 sets it per engine", PATCH_ID, backend)
        return structured_outputs_params(*args, **kwargs)

    GuidedDecodingParams.__qualname__ = "GuidedDecodingParams"
    GuidedDecodingParams.__doc__ = f"trl_compat {PATCH_ID}: vLLM < 0.12's GuidedDecodingParams, built as StructuredOutputsParams."
    return GuidedDecodingParams


def takes(callable_, name: str) -> bool:
    """Whether ``callable_`` (vLLM's SamplingParams) has a parameter ``name``; True when unknown."""
    try:
        return name in inspect.signature(callable_).parameters
    except (TypeError, ValueError):
        return True


def renaming(original):
    """``SamplingParams`` that passes ``guided_decoding=`` on as ``structured_outputs=``."""

    @functools.wraps(original, updated=())
    def SamplingParams(*args, **kwargs):
        if "guided_decoding" in kwargs:
            value = kwargs.pop("guided_decoding")
            kwargs.setdefault("structured_outputs", value)
        return original(*args, **kwargs)

    return SamplingParams


def apply(module, patcher):
    found, _ = importers()
    cancelled = []
    patcher.on_undo(lambda: cancelled.append(True))  # hooks that have not fired yet do nothing then

    def add_name(sampling_params):
        if cancelled or hasattr(sampling_params, "GuidedDecodingParams"):
            return
        with guarded(PATCH_ID, f"adding GuidedDecodingParams to {SAMPLING_MODULE}"):
            patcher.replace(sampling_params, "GuidedDecodingParams", guided_decoding_params(sampling_params.StructuredOutputsParams))

    def rename_keyword(trl_module):
        if cancelled:
            return
        with guarded(PATCH_ID, f"wrapping {trl_module.__name__}.SamplingParams"):
            if not takes(trl_module.SamplingParams, "guided_decoding"):
                patcher.wrap(trl_module, "SamplingParams", renaming)

    hooks.when_imported(SAMPLING_MODULE, add_name)
    for name in found:
        hooks.when_imported(name, rename_keyword)
