"""The guard's hooks on TRL's ``VLLMClient`` (``trl vllm-serve``, TRL 0.16+): what the client can
check of a server.

On the client: P (the server's prompt ids from TRL 0.24, else vLLM's tokenisation of the text sent,
re-done with the trainer's tokenizer), S (the sampling arguments sent) and C (a weight sync,
``update_named_param``, must be followed by ``reset_prefix_cache`` before the next ``generate``).
W2 and the engine's own call order need the server's process: with trl_compat active there
(``trl-compat run -- trl vllm-serve``, or ``TRL_COMPAT_AUTO=1``) and the guard on, the in-process
hooks of :mod:`.vllm` run in the server and its alarms are logged by the server. The server has
no channel back into the trainer's metrics.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from trl_compat._engine import guarded
from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._mode import GUARD_ID, log
from trl_compat.guard._records import Sampled, Sampling
from trl_compat.guard._run import Run
from trl_compat.guard.checks import engine_calls
from trl_compat.guard.observe import instances, trainers, vllm

SAMPLING_ARGUMENTS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "guided_decoding_regex",
    "structured_outputs_regex",
)


def instrument_class(module: Any, patcher: Any) -> None:
    patcher.wrap(module.VLLMClient, "__init__", _init_wrapper)


def _init_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with guarded(GUARD_ID, "instrumenting a vLLM client", fallback="this client is not guarded", logger=log):
            instrument(self)

    return __init__


def instrument(client: Any) -> None:
    if instances.instrumented(client):
        return
    engine = EngineRecord(None, prefix_caching=True)  # the server's cache: TRL resets it after every sync
    # chat: TRL 0.20+ sends conversational prompts as messages (the server applies the template)
    for name in ("generate", "chat"):
        instances.wrap_method(client, name, functools.partial(_generate_hook, engine, _signature(type(client), name)))
    instances.wrap_method(client, "update_named_param", functools.partial(_sync_hook, engine))
    instances.wrap_method(
        client,
        "reset_prefix_cache",
        functools.partial(vllm.event_hook, engine, "reset_prefix_cache", engine_calls.reset_prefix_cache),
    )


def _signature(cls: type, name: str) -> inspect.Signature | None:
    try:
        return inspect.signature(getattr(cls, name))
    except (AttributeError, TypeError, ValueError):
        return None


def _sync_hook(engine: EngineRecord, call: Callable[..., Any]) -> Callable[..., Any]:
    def update_named_param(*args: Any, **kwargs: Any) -> Any:
        result = call(*args, **kwargs)
        with guarded(GUARD_ID, "recording a weight sync to the server", fallback="the sync is not checked", logger=log):
            engine_calls.synced(engine, trainers.step_of(trainers.syncing(engine)))
        return result

    return update_named_param


def _generate_hook(engine: EngineRecord, signature: inspect.Signature | None, call: Callable[..., Any]) -> Callable[..., Any]:
    def generate(*args: Any, **kwargs: Any) -> Any:
        run: Run | None = None
        with guarded(GUARD_ID, "checking the server before generate", fallback="this generation is not checked", logger=log):
            run = trainers.generating(engine)
            engine_calls.before_generate(engine, run)
        result = call(*args, **kwargs)
        with guarded(GUARD_ID, "recording the server's completions", fallback="this generation is not checked", logger=log):
            if run is not None and signature is not None:
                record(run, dict(signature.bind_partial(None, *args, **kwargs).arguments), result)
        return result

    return generate


def _token_logprobs(values: Any, ids: tuple[int, ...], token_ids: Any = None) -> tuple[float, ...] | None:
    """The sampled tokens' log-probs: one number per token (TRL 0.23 - 0.28), or per token a
    rank-sorted list with ``logprob_token_ids`` beside it (0.29+), where the sampled token's entry is
    the one with its id (the first only when nothing else was asked for)."""
    if not isinstance(values, list) or len(values) != len(ids):
        return None
    out: list[float] = []
    for position, value in enumerate(values):
        if isinstance(value, list):
            ranked = token_ids[position] if isinstance(token_ids, list) and position < len(token_ids) else None
            at = ranked.index(ids[position]) if isinstance(ranked, list) and ids[position] in ranked else 0
            value = value[at] if value else None
        if not isinstance(value, (int, float)):
            return None
        out.append(float(value))
    return tuple(out)


def record(run: Run, arguments: dict[str, Any], result: Any) -> None:
    """Keep each completion the server returned for matching with the loss's rows."""
    prompts = list(arguments.get("prompts") or arguments.get("messages") or [])
    n = int(arguments.get("n") or 1)
    if isinstance(result, dict):
        completions, prompt_ids, logprobs = result.get("completion_ids"), result.get("prompt_ids"), result.get("logprobs")
        token_ids = result.get("logprob_token_ids")
    else:
        completions, prompt_ids, logprobs, token_ids = result, None, None, None
    if not isinstance(completions, list) or len(completions) != len(prompts) * n:
        return
    fields = {name: arguments[name] for name in SAMPLING_ARGUMENTS if name in arguments}
    fields.update(arguments.get("generation_kwargs") or {})  # TRL 0.19+: they override on the server
    sampling = Sampling.of(fields)
    truncate = arguments.get("truncate_prompt_tokens")
    number, step, store = vllm.new_call(run), run.step, run.pending
    for index, ids in enumerate(completions):
        prompt = prompts[index // n]
        # a prompt sent as ids (TRL 1.0+) is what vLLM got; a conversation (chat) is known only by the ids returned
        sent_ids = isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        known = prompt_ids[index // n] if isinstance(prompt_ids, list) else (prompt if sent_ids else None)
        store.add(
            Sampled(
                call=number,
                step=step,
                prompt_ids=tuple(known) if known is not None else None,
                prompt_text=prompt if known is None and isinstance(prompt, str) else None,
                completion_ids=tuple(int(t) for t in ids),
                logprobs=_token_logprobs(logprobs[index], tuple(ids), token_ids[index] if isinstance(token_ids, list) else None)
                if isinstance(logprobs, list) and index < len(logprobs)
                else None,
                sampling=sampling,
                engine=None,
                truncate=truncate if isinstance(truncate, int) and truncate > 0 else None,
            )
        )
