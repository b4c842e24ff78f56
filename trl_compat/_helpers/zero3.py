"""One way to recognise and handle DeepSpeed ZeRO-3, for the patches and the vLLM sync.

What ``zero3-unwrap``, ``zero3-hooks-api``, ``reward-model-zero3`` and :mod:`trl_compat._helpers.vllm_sync`
share: is ZeRO stage 3 in use (read from accelerate's DeepSpeed plugin), the parameter offload
TRL's ``remove_hooks``/``add_hooks`` work on, DeepSpeed's name for re-registering its module
hooks (``_register_hooks_recursively``, renamed ``_register_deepspeed_module`` in DeepSpeed
0.16.4, PR #6847) and whether TRL's ``add_hooks`` knows the new one, and gathering partitioned
parameters for a while. Nothing is imported from DeepSpeed until a parameter needs gathering or
its offload class is looked up.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from trl_compat._helpers.source import SourceUnavailable, code

OLD = "_register_hooks_recursively"
NEW = "_register_deepspeed_module"
OFFLOAD_MODULE = "deepspeed.runtime.zero.parameter_offload"


def plugin(accelerator: Any) -> Any:
    """accelerate's DeepSpeed plugin of ``accelerator``, or None."""
    return getattr(getattr(accelerator, "state", None), "deepspeed_plugin", None)


def is_zero3(accelerator: Any) -> bool:
    """Whether ``accelerator`` runs DeepSpeed ZeRO stage 3, by the plugin's ``zero_stage``."""
    found = plugin(accelerator)
    return found is not None and getattr(found, "zero_stage", None) == 3


def config_stage(trainer: Any) -> int | None:
    """The ZeRO stage the DeepSpeed config of a Trainer names; None without DeepSpeed."""
    if not getattr(trainer, "is_deepspeed_enabled", False):
        return None
    config = getattr(plugin(trainer.accelerator), "deepspeed_config", None) or {}
    return (config.get("zero_optimization") or {}).get("stage")


def offload(model: Any) -> Any:
    """The ``DeepSpeedZeRoOffload`` behind a ZeRO-3 engine, as TRL's remove_hooks/add_hooks find
    it; None for anything without an ``optimizer`` (a bare module)."""
    optimizer = getattr(model, "optimizer", None)  # nn.Module raises AttributeError: bare modules give None
    if optimizer is None:
        return None
    return getattr(optimizer, "parameter_offload", optimizer)


def hook_list(model: Any) -> Any:
    """The ZeRO-3 offload's list of forward hooks (not a list: not a ZeRO-3 engine)."""
    return getattr(offload(model), "forward_hooks", None)


def reregister_hooks(model: Any) -> bool:
    """Put the ZeRO-3 hooks back through the new name where the offload has only that one
    (what TRL >= 0.16 does); False, having done nothing, otherwise."""
    found = offload(model)
    if found is None or hasattr(found, OLD) or not hasattr(found, NEW):
        return False
    getattr(found, NEW)(found.module)
    return True


def offload_class() -> Any:
    """The installed ``DeepSpeedZeRoOffload`` class (nothing is initialised)."""
    module = sys.modules.get(OFFLOAD_MODULE)
    if module is None:
        # trl.models.utils imports deepspeed at its top whenever it is installed, and
        # deepspeed's engine imports this module: normally this is a dictionary lookup.
        module = importlib.import_module(OFFLOAD_MODULE)
    return module.DeepSpeedZeRoOffload


@functools.cache
def add_hooks_knows_new_name(add_hooks: Any) -> bool:
    """TRL's ``add_hooks`` calls the new name itself (TRL >= 0.16); False if unreadable."""
    try:
        return NEW in code(add_hooks)
    except SourceUnavailable:
        return False


@contextlib.contextmanager
def gathered(params: Iterable[Any]) -> Iterator[None]:
    """Make the partitioned ones among ``params`` whole for the duration (read-only; a
    collective: every rank must enter with the same parameters)."""
    params = list({id(p): p for p in params if p is not None and hasattr(p, "ds_id")}.values())
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params):
        yield
