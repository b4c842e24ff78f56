"""The loss's side: the rows TRL computes per-token log-probs for, matched to vLLM's completions.

TRL's log-prob function (``_helpers.logps_calls``) receives every row the loss trains on as
``input_ids`` (prompt, then completion), its ``attention_mask`` and ``logits_to_keep`` (the
completion's length), and returns the per-token log-probs. From 0.15 it is a method: the guard
wraps it on the trainer instance (see :mod:`.trainers`). In TRL 0.14.0 it is a function nested in
``compute_loss``: a forward pre-hook on the policy model reads its ``input_ids`` when that
function's frame is on the stack (no log-probs: check L is unavailable there).
"""

from __future__ import annotations

import functools
import inspect
import weakref
from typing import Any

from trl_compat._engine import guarded
from trl_compat._helpers import logps_calls
from trl_compat.guard._ledger import LEDGER
from trl_compat.guard._mode import GUARD_ID, active, log
from trl_compat.guard._records import Sampled
from trl_compat.guard._run import Run
from trl_compat.guard.checks import logprobs, prompts, sampling
from trl_compat.guard.observe import instances


def attach(trainer: Any, run: Run) -> None:
    """Hook ``trainer``'s log-prob function (its run keeps the function found)."""
    caller = run.caller = logps_calls.find(type(trainer))
    if caller is None:
        LEDGER.warn_once("no-logps", "TRL's log-prob function was not found: checks P, S and L are off")
        return
    if caller.kind == logps_calls.METHOD:
        signature = inspect.signature(logps_calls.unwrap(getattr(type(trainer), caller.name)))
        instances.wrap_method(trainer, caller.name, functools.partial(_method_hook, trainer, run, signature, caller))
    else:
        _nested_hook(trainer, run, caller)


def _method_hook(trainer: Any, run: Run, signature: inspect.Signature, caller: Any, call: Any) -> Any:
    ref = weakref.ref(trainer)

    def logps(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        owner = ref()
        if owner is not None and run.generations:
            with guarded(
                GUARD_ID, "matching the loss's rows to vLLM's completions", fallback="these rows are not checked", logger=log
            ):
                arguments = signature.bind_partial(owner, *args, **kwargs).arguments
                values = result[0] if isinstance(result, tuple) else result
                observe(
                    run,
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


def _nested_hook(trainer: Any, run: Run, caller: Any) -> None:
    ref = weakref.ref(trainer)

    def pre(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
        owner = ref()
        if owner is None or not active() or not run.generations:
            return None
        frame = logps_calls.frame_of(caller.raw)
        if frame is None:  # a generate forward of the same model, not TRL's log-prob function
            return None
        with guarded(GUARD_ID, "matching the loss's rows to vLLM's completions", fallback="these rows are not checked", logger=log):
            keep = frame.f_locals.get("num_logits_to_keep", frame.f_locals.get("logits_to_keep"))
            input_ids = args[0] if args else kwargs.get("input_ids")
            observe(run, owner, caller, module, input_ids, None, keep, None)
        return None

    model = getattr(trainer, "model", None)
    if model is not None and hasattr(model, "register_forward_pre_hook"):
        handle = model.register_forward_pre_hook(pre, with_kwargs=True)
        instances.on_undo(handle.remove)


def tokens(trainer: Any) -> tuple[int | None, int | None, Any]:
    """(pad id, eos id, tokenizer) of the trainer's processing class."""
    processing = getattr(trainer, "processing_class", None) or getattr(trainer, "tokenizer", None)
    tokenizer = getattr(processing, "tokenizer", processing)
    return getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None), tokenizer


def split_rows(
    input_ids: Any, attention_mask: Any, keep: int, pad: int | None, eos: int | None
) -> list[tuple[list[int], tuple[int, ...]]]:
    """Each row's (prompt ids, completion ids) as the loss sees them: masked positions dropped; with
    no mask (TRL 0.14), the prompt's left padding and everything after the completion's EOS."""
    ids = input_ids.tolist()
    mask = attention_mask.tolist() if attention_mask is not None else None
    rows: list[tuple[list[int], tuple[int, ...]]] = []
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


def observe(run: Run, trainer: Any, caller: Any, model: Any, input_ids: Any, attention_mask: Any, keep: Any, values: Any) -> None:
    """Match the rows of one log-prob call and run P, S and L on them, at the run's step."""
    if input_ids is None or not isinstance(keep, int) or keep <= 0:
        return
    step = run.step
    pad, eos, tokenizer = tokens(trainer)
    store = run.pending
    matched: list[tuple[int, list[int], Sampled]] = []
    for index, (prompt, completion) in enumerate(split_rows(input_ids, attention_mask, keep, pad, eos)):
        sampled = store.find(completion)
        if sampled is not None:
            matched.append((index, prompt, sampled))
    if not matched:
        return
    fresh = [(i, p, s) for i, p, s in matched if not s.prompt_checked]
    if fresh:
        prompts.check(run, fresh, tokenizer)
        sampling.check(run, trainer, caller, [s for _, _, s in fresh])
        for _, _, s in fresh:
            s.prompt_checked = True
        LEDGER.rows_checked += len(fresh)
        run.add("rows_checked", len(fresh))
    if values is not None and _is_policy(trainer, model):
        rows = [(s, values[i]) for i, _, s in matched if not s.logprobs_checked and s.step == step]
        if rows:
            logprobs.compare(run, rows)
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
