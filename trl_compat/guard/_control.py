"""Turning the guard on and off: ``TRL_COMPAT_GUARD`` at ``import trl_compat``, or :func:`enable`.

On, it hooks vLLM's ``LLM.__init__`` (and ``VLLMClient.__init__`` in TRL's two client modules)
as each module is imported, and puts its callback into transformers' defaults. Off again
(:func:`disable`), everything it set is undone; engines and trainers built while it was on keep
instance wrappers that pass straight through.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, List, Optional

from trl_compat._engine import Patcher, guarded, hooks, settings

log = logging.getLogger("trl_compat.guard")
GUARD_ID = "offpolicy-guard"
CLASS_TARGETS = (
    ("vllm.entrypoints.llm", "LLM.__init__"),
    ("trl.extras.vllm_client", "VLLMClient.__init__"),  # TRL 0.16 - 0.27
    ("trl.generation.vllm_client", "VLLMClient.__init__"),  # TRL 0.28+
)

_lock = threading.RLock()
_mode = "off"  # off | on | strict
_observing = 0  # depth of observing() blocks: alarms are not raised
_patchers: List[Patcher] = []
_hooked = False
_resumed: Optional[str] = None  # the mode pause() keeps for resuming


def active() -> bool:
    return _mode != "off"


def is_strict() -> bool:
    return _mode == "strict" and not _observing


def observing_now() -> bool:
    return bool(_observing)


def mode() -> str:
    return _mode


def enable(strict: bool = False) -> None:
    global _mode, _hooked
    with _lock:
        _mode = "strict" if strict else "on"
        if _hooked:
            return
        _hooked = True
    for module_name, attribute in CLASS_TARGETS:
        hooks.when_imported(module_name, _class_hook(module_name, attribute))
    hooks.when_imported("transformers.trainer", _callback_hook)


def disable() -> None:
    """Switch the guard off and undo what it set."""
    global _mode, _hooked
    from trl_compat.guard import _callback, _instances

    with _lock:
        _mode, _hooked = "off", False
        patchers, _patchers[:] = list(_patchers), []
    for patcher in reversed(patchers):
        patcher.undo()
    _instances.undo_all()
    _callback.remove()


def pause(paused: bool) -> None:
    """Stop (True) or resume (False) checking without undoing anything: the hooks pass straight
    through while paused. For measuring the guard's cost in one run."""
    global _mode, _resumed
    with _lock:
        if paused and _mode != "off":
            _resumed, _mode = _mode, "off"
        elif not paused and _resumed is not None:
            _mode, _resumed = _resumed, None


def from_environment() -> None:
    chosen = settings.guard_mode()
    if chosen != "off":
        enable(strict=chosen == "strict")


def _class_hook(module_name: str, attribute: str) -> Callable[[Any], None]:
    def hook(module: Any) -> None:
        if not active():
            return
        with guarded(GUARD_ID, f"hooking {module_name}.{attribute}", fallback="the guard does not see this part of vLLM", logger=log):
            patcher = Patcher(GUARD_ID, changes=[f"{module_name}:{attribute}"])
            try:
                if module_name == "vllm.entrypoints.llm":
                    from trl_compat.guard import _vllm

                    _vllm.instrument_class(module, patcher)
                else:
                    from trl_compat.guard import _client

                    _client.instrument_class(module, patcher)
            except BaseException:
                patcher.undo()
                raise
            with _lock:
                _patchers.append(patcher)

    return hook


def _callback_hook(module: Any) -> None:
    if not active():
        return
    with guarded(GUARD_ID, "adding the guard's trainer callback", fallback="no offpolicy/* metrics, no strict raise", logger=log):
        from trl_compat.guard import _callback

        _callback.add(module)


class observing:
    """``with trl_compat.guard.observing():`` alarms are logged and counted but not raised (tests
    that reproduce a bug on purpose)."""

    def __enter__(self) -> "observing":
        global _observing
        with _lock:
            _observing += 1
        return self

    def __exit__(self, *exc: Optional[BaseException]) -> None:
        global _observing
        with _lock:
            _observing -= 1
