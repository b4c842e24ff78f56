"""fsdp2-ignored-params-sync: use_vllm + FSDP2 with ``ignored_params``: the first weight sync raises AttributeError.

The bug (TRL issue #6622, open; PR #6623, open): TRL's FSDP2 weight sync calls ``param.full_tensor()``
on every parameter. FSDP2 (torch >= 2.7's ``fully_shard(..., ignored_params=...)``, accelerate's
``ignored_modules``) leaves the parameters it was told to ignore as plain tensors, which have no
``full_tensor``: ``AttributeError: 'Tensor' object has no attribute 'full_tensor'`` at the first
sync, colocate and server mode alike. Brought by PR #3687 (0.20.0, commit 5522cc0a3), the first
FSDP2 sync; not fixed upstream. Three shapes of the same walk:

- 0.20 - 0.27: ``GRPOTrainer._sync_fsdp2_params_to_vllm`` walks ``module.state_dict()``;
- 0.28 - 1.10: ``VLLMGeneration._sync_fsdp2_params_to_vllm`` (``trl/generation/vllm_generation.py``),
  the same walk, sending through ``_push_param_to_vllm``;
- 1.11+: the generator ``VLLMGeneration._iter_fsdp2_params`` walks ``module.named_parameters()``.

Probe: the newest of the three methods the release has; none: "not needed" (TRL < 0.20). It calls
``param.full_tensor()`` with no ``DTensor``/``hasattr`` test: "needed"; with one: "not needed" (the
day TRL fixes it, as PR #6623 does); no ``full_tensor()`` at all: "undecided".

Fix (PR #6623's: an ignored parameter is used as it is, only DTensors are gathered): while TRL's
method runs, the module handed to it returns each plain tensor of its ``state_dict()`` and
``named_parameters()`` as a DTensor replicated on the mesh of the sharded parameters, whose
``full_tensor()`` is the tensor itself (no communication). Every name, PEFT rule and send is
TRL's own; the module's methods are its class's again when the call (or, for the generator, the
walk) ends. A module with no DTensor is left alone.

Run time: load-bearing: errors propagate. Without the replacement TRL raises the AttributeError
this patch exists to prevent; falling back to it would only move the crash.

Delete when: a TRL release gathers only the DTensors in its FSDP2 weight sync (issue #6622) and older releases are
no longer supported (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys

from trl_compat._engine import instance_overrides, needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import code, defining_class

SYNC = "_sync_fsdp2_params_to_vllm"  # 0.20 - 0.27 on GRPOTrainer, 0.28 - 1.10 on VLLMGeneration
WALK = "_iter_fsdp2_params"  # 1.11+, VLLMGeneration


def target(module):
    """``(owner, name)`` of the release's FSDP2 walk, or ``(None, None)``."""
    generation = getattr(module, "VLLMGeneration", None)
    for owner, name in ((generation, WALK), (generation, SYNC), (getattr(module, "GRPOTrainer", None), SYNC)):
        if isinstance(owner, type) and defining_class(owner, name) is not None:
            return owner, name
    return None, None


def probe(module):
    owner, name = target(module)
    if owner is None:
        return not_needed("no FSDP2 weight sync in this TRL (< 0.20)")
    where = f"{owner.__name__}.{name}"
    walk = code(getattr(owner, name))
    if "full_tensor()" not in walk:
        return undecided(f"{where} calls no full_tensor(): not the FSDP2 walk this patch knows")
    if "DTensor" in walk or "hasattr(" in walk:
        return not_needed(f"{where} calls full_tensor() only on DTensors (issue #6622 fixed)")
    return needed(
        f"{where} calls full_tensor() on every parameter: those FSDP2 ignores (ignored_params) are plain tensors "
        "and raise AttributeError; the patch hands them to TRL as replicated DTensors, so they are sent as they are"
    )


def _dtensor_class():
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)


def _mesh(module, dtensor):
    for param in type(module).parameters(module):
        if isinstance(param, dtensor):
            return param.device_mesh
    return None


@contextlib.contextmanager
def plain_tensors_replicated(module):
    """Within the block, ``module.state_dict()`` and ``module.named_parameters()`` give each plain
    tensor as a DTensor replicated on the mesh of the module's sharded parameters."""
    dtensor = _dtensor_class()
    mesh = None if dtensor is None or not hasattr(module, "parameters") else _mesh(module, dtensor)
    if mesh is None:  # not FSDP2-sharded: TRL's walk as it is
        yield
        return
    from torch.distributed.tensor import Replicate

    placements = [Replicate()] * mesh.ndim
    cls = type(module)

    def replicated(tensor):
        if isinstance(tensor, dtensor):
            return tensor
        return dtensor.from_local(tensor.detach(), mesh, placements, run_check=False)

    def state_dict(*args, **kwargs):
        out = cls.state_dict(module, *args, **kwargs)
        for key, value in list(out.items()):
            out[key] = replicated(value)
        return out

    def named_parameters(*args, **kwargs):
        for name, param in cls.named_parameters(module, *args, **kwargs):
            yield name, replicated(param)

    with instance_overrides(module, state_dict=state_dict, named_parameters=named_parameters):
        yield


def _make_wrapper(original):
    if inspect.isgeneratorfunction(inspect.unwrap(original)):

        @functools.wraps(original)
        def walk(self, *args, **kwargs):
            with plain_tensors_replicated(arguments(original, self, *args, **kwargs).get("module")):
                yield from original(self, *args, **kwargs)

        return walk

    @functools.wraps(original)
    def sync(self, *args, **kwargs):
        with plain_tensors_replicated(arguments(original, self, *args, **kwargs).get("module")):
            return original(self, *args, **kwargs)

    return sync


def apply(module, patcher):
    owner, name = target(module)
    patcher.wrap(owner, name, _make_wrapper)
