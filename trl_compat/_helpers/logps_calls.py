"""TRL's per-token log-prob model calls: where they are made, and hooks that act on those calls only.

Used by the ``logps-attention-mask`` and ``logps-temperature`` patches. GRPOTrainer calls the
policy and the reference model for log-probs from one function:

* ``GRPOTrainer._get_per_token_logps(self, model, input_ids, attention_mask, logits_to_keep)``
  (TRL 0.15 - 0.19; ``_get_per_token_logps_and_entropies`` from 0.20), or
* ``get_per_token_logps(model, input_ids, logits_to_keep)``, a function nested in
  ``GRPOTrainer.compute_loss`` (TRL 0.14.0 and the 0.15.0.dev0 builds before PR #2762).

The nested function cannot be wrapped, and ``compute_loss`` also generates with the same model.
So the patches register forward hooks on the modules TRL is about to call, for the duration of the
call, and each hook acts only when the frame of TRL's log-prob function is on the stack: the
``generate`` forwards of the same module pass through untouched. The hooks sit on the module TRL
calls itself (a PeftModel, DDP or DeepSpeed engine included), not on the innermost model, whose
module hooks PEFT bypasses.
"""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterable, Iterator
from typing import Any, Callable, NamedTuple

from trl_compat._engine import Verdict, not_needed, undecided
from trl_compat._helpers.source import Code, code, defining_class, unwrap

NESTED = "get_per_token_logps"
METHOD = "_get_per_token_logps"
METHODS = (METHOD, "_get_per_token_logps_and_entropies")  # the latter from 0.20
_MAX_DEPTH = 64  # frames between a hook and TRL's function: module __call__ layers, wrappers


class LogpsCaller(NamedTuple):
    """The function of the installed TRL that calls the models for log-probs."""

    kind: str  # METHOD or NESTED
    name: str  # the GRPOTrainer method to wrap: the method itself, or compute_loss for NESTED
    where: str  # for reasons: "GRPOTrainer._get_per_token_logps" / "... nested in GRPOTrainer.compute_loss"
    code: Code  # its normalised source
    raw: types.CodeType  # its code object, to recognise its frames


def find(cls: type[Any]) -> LogpsCaller | None:
    """TRL's log-prob function in ``cls`` (a GRPOTrainer), or None if it has neither form.

    Raises SourceUnavailable when the source cannot be read."""
    for name in METHODS:
        if defining_class(cls, name) is not None:
            fn = unwrap(getattr(cls, name))
            return LogpsCaller(METHOD, name, f"GRPOTrainer.{name}", code(fn), fn.__code__)
    if defining_class(cls, "compute_loss") is None:
        return None
    outer = unwrap(cls.compute_loss)
    nested = next(
        (
            c
            for c in getattr(getattr(outer, "__code__", None), "co_consts", ())
            if isinstance(c, types.CodeType) and c.co_name == NESTED
        ),
        None,
    )
    if nested is None:
        return None
    return LogpsCaller(NESTED, "compute_loss", f"the function {NESTED} nested in GRPOTrainer.compute_loss", code(nested), nested)


def unfixed(cls: type, marker: str, fixed: str) -> tuple[LogpsCaller | None, Verdict | None]:
    """The start of a probe of TRL's log-prob function: ``(caller, verdict)``, where a verdict ends
    the probe: "undecided" when ``cls`` has neither form, "not needed" when the function's code
    mentions ``marker`` (``fixed`` says what that means: "<where> {fixed}")."""
    caller = find(cls)
    if caller is None:
        return None, undecided(f"GRPOTrainer has neither {METHOD} nor a {NESTED} nested in compute_loss")
    if marker in caller.code:
        return caller, not_needed(f"{caller.where} {fixed}")
    return caller, None


def frame_of(raw: types.CodeType) -> types.FrameType | None:
    """The nearest frame of the function with code object ``raw`` on the caller's stack (None: not on it)."""
    frame: types.FrameType | None = sys._getframe(1)
    for _ in range(_MAX_DEPTH):
        if frame is None or frame.f_code is raw:
            return frame
        frame = frame.f_back
    return None


def called_from(raw: types.CodeType) -> bool:
    """Whether a frame of the function with code object ``raw`` is on the caller's stack."""
    return frame_of(raw) is not None


@contextlib.contextmanager
def hooked(modules: Iterable[Any], *, pre: Callable | None = None, post: Callable | None = None) -> Iterator[None]:
    """Register ``pre`` (a forward pre-hook, run before the module's other pre-hooks, as if TRL had
    passed what it adds) and ``post`` (a forward hook, run after the others, as if TRL had changed
    the output itself), both ``with_kwargs=True``, on each distinct ``torch.nn.Module`` in
    ``modules`` for the duration of the block."""
    import torch

    handles, seen = [], set()
    try:
        for module in modules:
            if not isinstance(module, torch.nn.Module) or id(module) in seen:
                continue
            seen.add(id(module))
            if pre is not None:
                handles.append(module.register_forward_pre_hook(pre, with_kwargs=True, prepend=True))
            if post is not None:
                handles.append(module.register_forward_hook(post, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
