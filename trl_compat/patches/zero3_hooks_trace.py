"""zero3-hooks-trace: invalidate DeepSpeed's ZeRO-3 parameter-coordinator trace when TRL puts the
hooks back after generation, as TRL 1.5.0 does.

The bug (TRL PR #4693, main commit aad3b6d71, in 1.5.0; DeepSpeed PR #8043, in 0.19.2)
    Under ZeRO-3 with transformers generation and ``ds3_gather_for_generation`` (the default),
    ``unwrap_model_for_generation`` gathers the weights, takes DeepSpeed's module hooks off
    (``remove_hooks``), generates and puts them back (``add_hooks``: ``_register_deepspeed_module``,
    ``_register_hooks_recursively`` before DeepSpeed 0.16.4). DeepSpeed's re-registration numbers the
    modules again from a counter it never resets (a mutable default argument): every ``ds_id``
    changes (a 2-layer model: the first submodule's id 1, then 175, then 349). Its
    ``PartitionedParameterCoordinator`` keys the trace it is recording by ``ds_id``. If a training
    forward had started recording (trace mode RECORD) before the generation, the next training
    forward's ``reset_step`` builds the parameter trace from the recorded modules, looks their new
    ids up in the old table and dies: ``IndexError: pop from an empty deque`` (``record_parameters``).
    In GRPO that is the second step's first forward whenever the generation does not run the engine's
    root module (whose pre-hook, which ``remove_hooks`` leaves in place, would otherwise settle the
    trace): a PEFT model, whose ``generate`` goes to the base model. TRL's ``remove_hooks``/``add_hooks``
    have done this since they came (PR #1483, 0.8.2), before GRPOTrainer (0.14.0). TRL 1.5.0's
    ``add_hooks`` calls ``coordinator._invalidate_trace()`` first; DeepSpeed 0.19.2 does the same when
    the root module is registered again (and its ``_invalidate_trace`` also clears the table).

How the probe recognises it
    Needed when the source of ``trl.models.utils.add_hooks`` (comments dropped) re-registers the hooks
    (either DeepSpeed name) and never names ``_invalidate_trace``, and the installed DeepSpeed's
    re-registration does not invalidate the trace itself; not needed where either does (TRL >= 1.5.0,
    DeepSpeed >= 0.19.2, dev builds told apart so); undecided where ``add_hooks`` re-registers by
    neither name, or DeepSpeed's offload class cannot be read.

The fix
    ``trl.models.utils.add_hooks`` is wrapped: before TRL's own (or zero3-hooks-api's) re-registration,
    the engine's ZeRO-3 coordinator (``optimizer.parameter_offload.param_coordinator``) has its trace
    invalidated unless it already is, exactly TRL 1.5.0's lines. The next training forward then
    records a fresh trace under the new ids. ``unwrap_model_for_generation`` (and zero3-unwrap's
    replacement) look ``add_hooks`` up as a module global, so they see the wrapper. A model without
    an optimizer (a bare module, before the first step) or without a coordinator (ZeRO-1/2) is
    passed through untouched.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.5.0 with DeepSpeed < 0.19.2 (the registry's ``remove_when``; a
test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import zero3
from trl_compat._helpers.source import code

INVALIDATE = "_invalidate_trace"


def probe(module):
    source = code(module.add_hooks)
    if INVALIDATE in source:
        return not_needed(f"TRL's add_hooks already calls {INVALIDATE} (TRL >= 1.5.0, PR #4693)")
    if zero3.NEW not in source and zero3.OLD not in source:
        return undecided(f"TRL's add_hooks re-registers the hooks by neither {zero3.NEW} nor {zero3.OLD}: the code moved")
    try:
        cls = zero3.offload_class()
        # DeepSpeed >= 0.16.4 re-registers through the new name (the old one, where kept, is not what TRL calls)
        register = getattr(cls, zero3.NEW, None) or getattr(cls, zero3.OLD)
        deepspeed_invalidates = INVALIDATE in code(register)
    except Exception as exc:  # noqa: BLE001 - a broken DeepSpeed install (or unreadable source) is not ours to judge
        return undecided(f"cannot read DeepSpeedZeRoOffload's hook registration ({type(exc).__name__}: {exc})")
    if deepspeed_invalidates:
        return not_needed(f"the installed DeepSpeed's hook registration calls {INVALIDATE} itself (DeepSpeed >= 0.19.2, PR #8043)")
    return needed(
        "TRL's add_hooks re-registers DeepSpeed's ZeRO-3 hooks (new ds_id numbers) without invalidating the "
        "coordinator's trace: a trace recorded before a generation fails the next step with IndexError: pop from an empty deque"
    )


def _invalidate(model) -> None:
    """TRL 1.5.0's lines: the ZeRO-3 coordinator's trace, if any, becomes invalid (recorded afresh)."""
    coordinator = getattr(zero3.offload(model), "param_coordinator", None)  # only ZeRO-3 has one
    if coordinator is not None and not coordinator.is_invalid_trace():
        coordinator._invalidate_trace()


def _wrap_add_hooks(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def add_hooks(*args, **kwargs):
        _invalidate(signature.bind(*args, **kwargs).arguments["model"])
        return original(*args, **kwargs)

    return add_hooks


def apply(module, patcher) -> None:
    patcher.wrap(module, "add_hooks", _wrap_add_hooks)
