"""The loss's side: the rows TRL computes per-token log-probs for, matched to vLLM's completions.

TRL's log-prob function (``_helpers.logps_calls``) receives every row the loss trains on as
``input_ids`` (prompt, then completion), its ``attention_mask`` and ``logits_to_keep`` (the
completion's length), and returns the per-token log-probs. From 0.15 it is a method: the guard
wraps it on the trainer instance (see :mod:`._trainers`). In TRL 0.14.0 it is a function nested in
``compute_loss``: a forward pre-hook on the policy model reads its ``input_ids`` when that
function's frame is on the stack (no log-probs: check L is unavailable there).
"""

from __future__ import annotations

import functools
import inspect
import logging
from typing import Any, List, Optional, Tuple

from trl_compat._engine import guarded
from trl_compat._helpers import logps_calls
from trl_compat.guard import _control, _instances, _trainers
from trl_compat.guard._alarms import LEDGER
from trl_compat.guard._records import Sampled, pending
from trl_compat.guard.checks import logprobs, prompts, sampling

log = logging.getLogger("trl_compat.guard")
GUARD_ID = "offpolicy-guard"


def attach(trainer: Any) -> None:
    caller = logps_calls.find(type(trainer))
    if caller is None:
        LEDGER.warn_once("no-logps", "TRL's log-prob function was not found: checks P, S and L are off")
        return
    if caller.kind == logps_calls.METHOD:
        signature = inspect.signature(logps_calls.unwrap(getattr(type(trainer), caller.name)))
        _instances.wrap_method(trainer, caller.name, functools.partial(_method_hook, trainer, signature, caller))
    else:
        _nested_hook(trainer, caller)


def _method_hook(trainer: Any, signature: inspect.Signature, caller: Any, call: Any) -> Any:
    import weakref

    ref = weakref.ref(trainer)

    def logps(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        owner = ref()
        if owner is not None and _any_generated():
            with guarded(
                GUARD_ID, "matching the loss's rows to vLLM's completions", fallback="these rows are not checked", logger=log
            ):
                arguments = signature.bind_partial(owner, *args, **kwargs).arguments
                values = result[0] if isinstance(result, tuple) else result
                observe(
                    owner,
                    caller,
                    arguments.get("model"),
                    arguments.get("input_ids"),
                    arguments.get("attention_mask"),
                    arguments.get("logits_to_keep"),
                    values,
                )
        return result

    return logps


def _any_generated() -> bool:
    return LEDGER.generations > 0


def _nested_hook(trainer: Any, caller: Any) -> None:
    import weakref

    ref = weakref.ref(trainer)

    def pre(module: Any, args: tuple, kwargs: dict) -> None:
        owner = ref()
        if owner is None or not _control.active() or not _any_generated():
            return None
        frame = logps_calls.frame_of(caller.raw)
        if frame is None:  # a generate forward of the same model, not TRL's log-prob function
            return None
        with guarded(GUARD_ID, "matching the loss's rows to vLLM's completions", fallback="these rows are not checked", logger=log):
            keep = frame.f_locals.get("num_logits_to_keep", frame.f_locals.get("logits_to_keep"))
            input_ids = args[0] if args else kwargs.get("input_ids")
            observe(owner, caller, module, input_ids, None, keep, None)
        return None

    model = getattr(trainer, "model", None)
    if model is not None and hasattr(model, "register_forward_pre_hook"):
        handle = model.register_forward_pre_hook(pre, with_kwargs=True)
        _instances.on_undo(handle.remove)


def tokens(trainer: Any) -> Tuple[Optional[int], Optional[int], Any]:
    """(pad id, eos id, tokenizer) of the trainer's processing class."""
    processing = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    tokenizer = getattr(processing, "tokenizer", processing)
    return getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None), tokenizer


def split_rows(input_ids: Any, attention_mask: Any, keep: int, pad: Optional[int], eos: Optional[int]) -> List[Tuple[list, tuple]]:
    """Each row's (prompt ids, completion ids) as the loss sees them: masked positions dropped; with
    no mask (TRL 0.14), the prompt's left padding and everything after the completion's EOS."""
    ids = input_ids.tolist()
    mask = attention_mask.tolist() if attention_mask is not None else None
    rows = []
    for index, row in enumerate(ids):
        prompt, completion = row[:-keep], row[-keep:]
        if mask is not None:
            prompt = [t for t, m in zip(prompt, mask[index][:-keep]) if m]
            completion = [t for t, m in zip(completion, mask[index][-keep:]) if m]
        else:
            while prompt and prompt[0] == pad:
                prompt = prompt[1:]
            if eos is not None and eos in completion:
                completion = completion[: completion.index(eos) + 1]
            while completion and completion[-1] == pad:
                completion = completion[:-1]
        rows.append((prompt, tuple(completion)))
    return rows


def observe(trainer: Any, caller: Any, model: Any, input_ids: Any, attention_mask: Any, keep: Any, values: Any) -> None:
    """Match the rows of one log-prob call and run P, S and L on them."""
    if input_ids is None or not isinstance(keep, int) or keep <= 0:
        return
    LEDGER.step = _trainers.global_step(trainer)
    pad, eos, tokenizer = tokens(trainer)
    store = pending(trainer)
    matched: List[Tuple[int, list, Sampled]] = []
    for index, (prompt, completion) in enumerate(split_rows(input_ids, attention_mask, keep, pad, eos)):
        sampled = store.find(completion)
        if sampled is not None:
            matched.append((index, prompt, sampled))
    if not matched:
        return
    fresh = [(i, p, s) for i, p, s in matched if not s.prompt_checked]
    if fresh:
        prompts.check(fresh, tokenizer)
        sampling.check(trainer, caller, [s for _, _, s in fresh])
        for _, _, s in fresh:
            s.prompt_checked = True
        LEDGER.rows_checked += len(fresh)
        LEDGER.add("rows_checked", len(fresh))
    if values is not None and _is_policy(trainer, model):
        rows = [(s, values[i]) for i, _, s in matched if not s.logprobs_checked and s.step == LEDGER.step]
        if rows:
            logprobs.compare(trainer, rows)
            for s, _ in rows:
                s.logprobs_checked = True


def _is_policy(trainer: Any, model: Any) -> bool:
    """Whether the call is on the policy as trained: not the reference model, not with PEFT's adapters disabled."""
    if model is None or model is getattr(trainer, "ref_model", None):
        return False
    for module in model.modules() if hasattr(model, "modules") else ():
        disabled = getattr(module, "disable_adapters", None)
        if isinstance(disabled, bool):
            return not disabled
    return True
