"""vllm-v1-engine: TRL 0.14/0.15's in-process vLLM sync crashes on vLLM's V1 engine (vLLM >= 0.8).

The bug (TRL issue #3115; vllm 0.8.0 + trl 0.15.2): TRL 0.14.0 - 0.15.2 build ``vllm.LLM(...)`` in
the training process and load new weights through
``self.llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights``: the V0
engine's internals. vLLM 0.8.0 made its V1 engine the default; V1's ``LLMEngine`` (with its engine
core in another process) has no ``model_executor``, so the first weight sync dies with
``AttributeError: 'LLMEngine' object has no attribute 'model_executor'``. TRL never fixed the
in-process path: 0.16 moved to a vLLM server, 0.18's colocate mode builds the engine with
``distributed_executor_backend="external_launcher"``. The workaround from the thread is
``VLLM_USE_V1=0``.

Where it shows: TRL 0.14.0 - 0.15.2 (and 0.16.0.dev0 builds before the server mode, PR #3094) with
``use_vllm=True`` on vLLM >= 0.8.0 where vLLM picks V1 (on a GPU; vLLM 0.8.x's CPU build falls
back to V0 by itself). vLLM 0.11.0 removed V0 (its ``vllm.engine.llm_engine.LLMEngine`` is an
alias of the V1 class; 0.10.2 still ships V0): there no setting brings ``model_executor`` back to
TRL 0.15 and this patch reports "undecided" (use vllm < 0.11 with TRL 0.14/0.15).

Probe: GRPOTrainer's source builds ``LLM(`` and reads ``llm_engine.model_executor`` without
``external_launcher``; the imported vLLM's ``envs`` defaults ``VLLM_USE_V1`` to "1"; its
``vllm.engine.llm_engine.LLMEngine`` is still the V0 class (defined there, sets
``self.model_executor``). ``VLLM_USE_V1`` already set: "0" gives "not needed", anything else
"undecided" (an explicit request for V1 is not overridden; TRL's sync will fail).

Fix: ``VLLM_USE_V1=0`` as a default: ``GRPOTrainer.__init__`` is wrapped and, when its config
has ``use_vllm=True`` and ``VLLM_USE_V1`` is unset, sets it in ``os.environ`` before TRL builds
``LLM`` (vLLM reads it lazily, at engine construction), with an INFO log line. It stays set, as
vLLM itself would set it, so the V0 engine's later reads agree: vLLM engines built afterwards in
this process use V0 unless the variable is changed. Reverting the patch removes the variable again
if it still holds the "0" this patch set.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.14.x and 0.15.x are no longer supported (or vLLM < 0.11, the last releases with
the V0 engine the patch selects) (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

log = logging.getLogger(__name__)

VAR = "VLLM_USE_V1"


def trl_reaches_model_executor(module) -> bool:
    """Whether GRPOTrainer builds an in-process ``LLM`` and reads the V0 engine's ``model_executor``."""
    source = code(module.GRPOTrainer)
    return "llm_engine.model_executor" in source and "LLM(" in source and "external_launcher" not in source


def _v0_engine(vllm_version):
    """The V0 ``LLMEngine`` class of the imported vLLM, or None with the reason."""
    try:
        engine_module = importlib.import_module("vllm.engine.llm_engine")
    except ImportError as exc:
        return None, f"vLLM {vllm_version} has no vllm.engine.llm_engine ({exc})"
    cls = getattr(engine_module, "LLMEngine", None)
    if cls is None or cls.__module__ != engine_module.__name__ or "self.model_executor =" not in code(cls):
        where = f"{cls.__module__}.{cls.__qualname__}" if cls is not None else "nothing"
        return None, f"vLLM {vllm_version}'s vllm.engine.llm_engine.LLMEngine is {where}, not the V0 engine"
    return cls, ""


def probe(module):
    if not trl_reaches_model_executor(module):
        return not_needed("GRPOTrainer does not read llm_engine.model_executor of an in-process vLLM engine")
    vllm = sys.modules.get("vllm")
    if vllm is None:
        return not_needed("TRL did not import vLLM (trl.import_utils.is_vllm_available() is False)")
    version = getattr(vllm, "__version__", "?")
    envs = sys.modules.get("vllm.envs") or importlib.import_module("vllm.envs")
    if f'os.getenv("{VAR}", "1")' not in code(envs):
        return not_needed(f"vLLM {version} does not default to its V1 engine")
    value = os.environ.get(VAR)
    if value is not None:
        if value.strip() == "0":
            return not_needed(f"{VAR}=0 is set: vLLM builds the V0 engine TRL's weight sync reads")
        return undecided(
            f"{VAR}={value} is set: vLLM builds its V1 engine, whose LLMEngine has no model_executor, and "
            f"TRL's first weight sync will raise AttributeError; unset {VAR} or set it to 0"
        )
    engine, why = _v0_engine(version)
    if engine is None:
        return undecided(
            f"{why} (V0 was removed in vLLM 0.11.0): no setting gives TRL's in-process weight sync the "
            "llm_engine.model_executor it reads; use vllm<0.11 with this TRL"
        )
    return needed(
        f"GRPOTrainer reads self.llm.llm_engine.model_executor, which vLLM {version}'s default V1 engine lacks "
        f"(AttributeError at the first weight sync); GRPOTrainer(use_vllm=True) now sets {VAR}=0 when unset, "
        "so TRL's engine is vLLM's V0 one"
    )


def apply(module, patcher):
    mine = []  # whether the "0" in os.environ is this patch's

    def default_to_v0(trainer, arguments) -> None:
        if VAR not in os.environ and getattr(arguments.get("args"), "use_vllm", False):
            os.environ[VAR] = "0"
            mine.append(True)
            log.info(
                "trl_compat: vllm-v1-engine: set %s=0 before GRPOTrainer builds its vLLM engine (TRL's "
                "in-process weight sync reads the V0 engine's model_executor); set %s to override",
                VAR,
                VAR,
            )

    around_init(before=default_to_v0)(module, patcher)

    def undo():
        if mine and os.environ.get(VAR) == "0":
            del os.environ[VAR]
        mine.clear()

    patcher.on_undo(undo)
