"""Turning the guard on and off (floor 4): ``TRL_COMPAT_GUARD`` at ``import trl_compat``, or
:func:`enable`.

On, it hooks vLLM's ``LLM.__init__`` (and ``VLLMClient.__init__`` in TRL's two client modules)
as each module is imported, and puts its callback into transformers' defaults. Off again
(:func:`disable`), everything it set is undone; engines and trainers built while it was on keep
instance wrappers that pass straight through.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

from trl_compat._engine import Patcher, guarded, hooks, settings
from trl_compat.guard._mode import GUARD_ID, active, log, switch

# The observers (and the checks and helpers below them) are imported when a hook first fires, not
# at ``import trl_compat``: TRL_COMPAT_GUARD=1 must not cost every process of an environment.

CLASS_TARGETS = (
    ("vllm.entrypoints.llm", "LLM.__init__"),
    ("trl.extras.vllm_client", "VLLMClient.__init__"),  # TRL 0.16 - 0.27
    ("trl.generation.vllm_client", "VLLMClient.__init__"),  # TRL 0.28+
)


class _Installed:
    """What enable() set in this process, for disable() to undo."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.hooked = False
        self.patchers: list[Patcher] = []


_INSTALLED = _Installed()


def enable(strict: bool = False) -> None:
    switch("strict" if strict else "on")
    with _INSTALLED.lock:
        if _INSTALLED.hooked:
            return
        _INSTALLED.hooked = True
    for module_name, attribute in CLASS_TARGETS:
        hooks.when_imported(module_name, _class_hook(module_name, attribute))
    hooks.when_imported("transformers.trainer", _callback_hook)


def disable() -> None:
    """Switch the guard off and undo what it set."""
    switch("off")
    with _INSTALLED.lock:
        _INSTALLED.hooked = False
        patchers, _INSTALLED.patchers = _INSTALLED.patchers, []
    for patcher in reversed(patchers):
        patcher.undo()
    from trl_compat.guard.observe import callback, instances

    instances.undo_all()
    callback.remove()


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
                    from trl_compat.guard.observe import vllm

                    vllm.instrument_class(module, patcher)
                else:
                    from trl_compat.guard.observe import client

                    client.instrument_class(module, patcher)
            except BaseException:
                patcher.undo()
                raise
            with _INSTALLED.lock:
                _INSTALLED.patchers.append(patcher)

    return hook


def _callback_hook(module: Any) -> None:
    if not active():
        return
    with guarded(GUARD_ID, "adding the guard's trainer callback", fallback="no offpolicy/* metrics, no strict raise", logger=log):
        from trl_compat.guard.observe import callback

        callback.add(module)
