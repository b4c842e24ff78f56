"""Preparing the models TRL is about to call: the per-model decision, and the wrapper of TRL's
entry point that makes it before each call."""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any

from trl_compat._engine import guarded
from trl_compat._helpers.models import peel
from trl_compat.patches.logits_to_keep.accepts import RENAME, SLICE, UNKNOWN, accepts, decide
from trl_compat.patches.logits_to_keep.forward import LOCK, SWITCH, wrap
from trl_compat.patches.logits_to_keep.trl_call import PATCH_ID, TrlCall

log = logging.getLogger(__name__)

_decisions: dict[str, str] = {}


def prepare_model(model: Any) -> str | None:
    """Make TRL's request reach ``model`` (the action taken, or None while the patch is off).

    Called by the patched TRL entry point for every model TRL is about to call;
    idempotent."""
    trl = SWITCH.active
    if trl is None or model is None:
        return None
    inner = peel(model)
    try:
        import torch

        if not isinstance(inner, torch.nn.Module):
            return UNKNOWN
    except ImportError:  # pragma: no cover - TRL needs torch
        return UNKNOWN
    accepted = accepts(type(inner))
    action = decide(accepted, trl)
    with LOCK:
        if action in (RENAME, SLICE) and accepted is not None:
            wrap(inner, accepted)
        key = f"{type(inner).__module__}.{type(inner).__qualname__}"
        if _decisions.get(key) != action:
            _decisions[key] = action
            log.log(
                logging.WARNING if action == UNKNOWN else logging.INFO,
                "trl_compat: %s: %s (forward takes %s%s; TRL passes %s): %s",
                PATCH_ID,
                type(inner).__name__,
                sorted(accepted.names) if accepted else "?",
                ", **kwargs" if accepted and accepted.var_kw else "",
                trl.passed,
                action,
            )
    return action


def decisions() -> dict[str, str]:
    """``{model class: action}`` for every model class TRL called while the patch was on."""
    with LOCK:
        return dict(_decisions)


def wrap_entry(original, trl: TrlCall):
    """The factory for TRL's entry point: prepares the models TRL is about to call."""
    signature = inspect.signature(original)

    def models_in(self, args, kwargs):
        if trl.entry == "_get_per_token_logps":
            return [signature.bind_partial(self, *args, **kwargs).arguments.get("model")]
        # 0.14.0: compute_loss's nested function gets `model` (model_wrapped in training, the
        # model in evaluation) and `self.ref_model`; all share their innermost model with these.
        return [getattr(self, "model", None), getattr(self, "model_wrapped", None), getattr(self, "ref_model", None)]

    @functools.wraps(original)
    def entry(self, *args, **kwargs):
        if SWITCH.active is not trl:
            # Reverted, but another patch wrapped this method after us, so the engine left us in
            # place: pass straight through.
            return original(self, *args, **kwargs)
        with guarded(PATCH_ID, "preparing the model", fallback="TRL runs unchanged", logger=log):
            for model in models_in(self, args, kwargs):
                prepare_model(model)
        return original(self, *args, **kwargs)

    return entry
