"""What tests of trl_compat and of its patches may reach of the engine's state, instead of its
private modules: save and put back the registered declarations, run a patch with another probe
or apply (fault injection), forget a patch as a reloaded copy of trl_compat would, and read
what an applied patch changed. Not for use outside tests."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Callable

from trl_compat._engine.lifecycle import unregister
from trl_compat._engine.patch import Patch
from trl_compat._engine.state import REGISTRY

__all__ = ["changed_owners", "forced", "forget", "restore", "snapshot"]


def snapshot() -> dict[str, Patch]:
    """The registered declarations, by id, in registration order."""
    with REGISTRY.lock:
        return {patch.id: patch for patch in REGISTRY.patches()}


def restore(saved: dict[str, Patch]) -> None:
    """Put back the declarations of ``saved``: a patch registered since is reverted and
    forgotten, a declaration swapped since is put back, a patch forgotten since is registered
    again (last). What is applied stays as it is: ``install()`` or ``revert()`` after this."""
    with REGISTRY.lock:
        for patch_id in REGISTRY:
            if patch_id not in saved:
                unregister(patch_id)
        for patch_id, patch in saved.items():
            if patch_id in REGISTRY:
                REGISTRY.redeclare(patch)
            else:
                REGISTRY.register(patch)


@contextlib.contextmanager
def forced(patch_id: str, probe: Callable[..., Any] | None = None, apply: Callable[..., Any] | None = None) -> Iterator[Patch]:
    """Within the block, the registered patch ``patch_id`` probes with ``probe`` and/or applies
    with ``apply`` (the other one stays its own); its declaration comes back on exit. Its state
    is kept: ``install(patch_id)`` inside the block runs the forced functions."""
    original = REGISTRY.patch(patch_id)
    functions = {name: f for name, f in (("probe", probe), ("apply", apply)) if f is not None}
    REGISTRY.redeclare(original.replace(**functions) if functions else original)
    try:
        yield REGISTRY.patch(patch_id)
    finally:
        REGISTRY.redeclare(original)


def forget(patch_id: str) -> None:
    """Drop the patch's declaration and state but leave what it changed in place: what a
    reloaded copy of trl_compat finds."""
    REGISTRY.forget(patch_id)


def changed_owners() -> list[Any]:
    """The modules and classes whose attributes the applied patches changed."""
    with REGISTRY.lock:
        owners = [owner for patch_id in REGISTRY for owner in _owners(patch_id)]
    return list({id(owner): owner for owner in owners}.values())


def _owners(patch_id: str) -> list[Any]:
    patcher = REGISTRY.state(patch_id).patcher
    return patcher.owners() if patcher is not None else []
