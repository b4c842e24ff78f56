"""The guard's hooks on vLLM's public surface, in process: ``LLM.__init__`` (class-level, the
one attribute of vLLM the guard wraps), then on each engine built: ``generate``, ``chat``,
``reset_prefix_cache``, ``sleep``, ``wake_up``, ``collective_rpc`` and its model's
``load_weights`` (the weight sync of every TRL release that runs vLLM in process).

Every hook records, then calls vLLM; the checks run in the guard's bookkeeping, whose own errors
are logged once and never reach the training run (``_engine.guarded``).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from trl_compat._engine import guarded
from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._ledger import LEDGER
from trl_compat.guard._mode import GUARD_ID, log
from trl_compat.guard._records import Sampled, Sampling
from trl_compat.guard._run import Run
from trl_compat.guard.checks import engine_calls, logprobs, weights
from trl_compat.guard.checks.logprobs_gate import sampled_logprobs
from trl_compat.guard.observe import instances, trainers

MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),  # V0; V1 colocate (TRL's own path)
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),  # V1 in process (vLLM 0.9+)
)


def _engine_model(llm: Any) -> Any:
    for path in MODEL_PATHS:
        node = llm
        for name in path:
            node = getattr(node, name, None)
            if node is None:
                break
        if node is not None and callable(getattr(node, "load_weights", None)):
            return node
    return None


def _logprobs_mode(llm: Any) -> str | None:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    mode = getattr(config, "logprobs_mode", None) or getattr(llm, "logprobs_mode", None)
    return str(getattr(mode, "value", mode)) if mode is not None else None


def _prefix_caching(llm: Any, arguments: dict[str, Any]) -> bool | None:
    if "enable_prefix_caching" in arguments.get("kwargs", {}):
        return bool(arguments["kwargs"]["enable_prefix_caching"])
    engine = getattr(llm, "llm_engine", None)
    for holder in (getattr(engine, "cache_config", None), getattr(getattr(engine, "vllm_config", None), "cache_config", None), llm):
        value = getattr(holder, "enable_prefix_caching", None)
        if isinstance(value, bool):
            return value
    return None


def instrument_class(module: Any, patcher: Any) -> None:
    """Wrap ``module.LLM.__init__`` (``vllm.entrypoints.llm``): every engine built from now on is instrumented."""
    patcher.wrap(module.LLM, "__init__", _init_wrapper)


def _init_wrapper(original: Callable[..., Any]) -> Callable[..., Any]:
    try:
        signature: inspect.Signature | None = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with guarded(GUARD_ID, "instrumenting a vLLM engine", fallback="this engine is not guarded", logger=log):
            arguments = _bind(signature, (self, *args), kwargs)
            instrument(self, _prefix_caching(self, arguments))

    return __init__


def _bind(signature: inspect.Signature | None, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    if signature is None:
        return {}
    try:
        return dict(signature.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return {}


def instrument(llm: Any, prefix_caching: bool | None) -> EngineRecord | None:
    """Hook one engine (once; a subclass's ``__init__`` calling its base's reaches here twice)."""
    if instances.instrumented(llm):
        return None
    engine = EngineRecord(llm, prefix_caching, model=_engine_model(llm), logprobs_mode=_logprobs_mode(llm))
    for name in ("generate", "chat"):
        instances.wrap_method(llm, name, functools.partial(_generate_hook, engine, name))
    for name, event in (
        ("reset_prefix_cache", engine_calls.reset_prefix_cache),
        ("sleep", engine_calls.sleep),
        ("wake_up", engine_calls.wake_up),
        ("collective_rpc", engine_calls.collective_rpc),
    ):
        instances.wrap_method(llm, name, functools.partial(event_hook, engine, name, event))
    if engine.model is not None:
        instances.wrap_method(engine.model, "load_weights", functools.partial(_sync_hook, engine))
    weights.engine_built(engine)
    return engine


def event_hook(engine: EngineRecord, name: str, event: Callable[..., None], call: Callable[..., Any]) -> Callable[..., Any]:
    def hook(*args: Any, **kwargs: Any) -> Any:
        loads = engine.own_loads
        engine.inside.append(name)
        try:
            result = call(*args, **kwargs)
        finally:
            engine.inside.pop()
        with guarded(GUARD_ID, f"recording vLLM's {name}", fallback="the call is not checked", logger=log):
            # whether vLLM really loaded weights during the call: a patch may have made it a no-op
            event(engine, args, kwargs, engine.own_loads > loads)
        return result

    return hook


def _sync_hook(engine: EngineRecord, call: Callable[..., Any]) -> Callable[..., Any]:
    def load_weights(*args: Any, **kwargs: Any) -> Any:
        if engine.inside:  # vLLM loading its own checkpoint (reload_weights), not a sync of the trainer's
            engine.own_loads += 1
            return call(*args, **kwargs)
        trainer = None
        with guarded(GUARD_ID, "recording a weight sync", fallback="the sync is not audited", logger=log):
            trainer = trainers.syncing(engine)
            args, kwargs = weights.audit_sync(engine, trainer, args, kwargs)
        result = call(*args, **kwargs)
        with guarded(GUARD_ID, "recording a weight sync", fallback="the sync is not checked", logger=log):
            engine_calls.synced(engine, trainers.step_of(trainer))
            weights.after_sync(engine)
        return result

    return load_weights


def _generate_hook(engine: EngineRecord, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def generate(*args: Any, **kwargs: Any) -> Any:
        run: Run | None = None
        restore: Callable[[], None] | None = None
        with guarded(GUARD_ID, "checking vLLM before generate", fallback="this generation is not checked", logger=log):
            run = trainers.generating(engine)
            if run is not None:
                logprobs.flush(run)  # the batches of the generation before are complete
            engine_calls.before_generate(engine, run)
            weights.before_generate(engine, engine.driver())
            if run is not None:
                restore = ask_for_logprobs(args, kwargs)
        try:
            outputs = call(*args, **kwargs)
        finally:
            if restore is not None:
                restore()
        with guarded(GUARD_ID, "recording vLLM's outputs", fallback="this generation is not checked", logger=log):
            if run is not None:  # generations of the user's own (eval scripts, ...) are not the loss's
                record_outputs(engine, run, outputs, args, kwargs)
        return outputs

    return generate


def ask_for_logprobs(args: tuple, kwargs: dict) -> Callable[[], None] | None:
    """Where a GRPO trainer's generate call did not ask vLLM for log-probs (TRL 0.14 - 0.22), ask
    (``logprobs=0``: no RNG is used for it, sampling is unchanged); returns how to undo it."""
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    objects = list(params) if isinstance(params, (list, tuple)) else [params]
    changed: list[Any] = []
    for obj in objects:
        if obj is None or isinstance(obj, dict) or not hasattr(obj, "logprobs") or obj.logprobs is not None:
            continue
        if any(o is obj for o in changed):
            continue
        obj.logprobs = 0
        changed.append(obj)
    if not changed:
        return None

    def restore() -> None:
        for obj in changed:
            obj.logprobs = None

    return restore


def _params_per_request(args: tuple, kwargs: dict, count: int) -> list[Any]:
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    if isinstance(params, (list, tuple)):
        return list(params)
    return [params] * count


def new_call(run: Run) -> int:
    """Count one generate call of ``run``; returns its number in this process."""
    run.generations += 1
    return LEDGER.new_generation()


def record_outputs(engine: EngineRecord | None, run: Run, outputs: Any, args: tuple, kwargs: dict[str, Any]) -> None:
    """Keep each completion of a generate call for matching with the loss's rows."""
    if not isinstance(outputs, (list, tuple)):
        return
    number, step, store = new_call(run), run.step, run.pending
    for output, params in zip(outputs, _params_per_request(args, kwargs, len(outputs))):
        sampling = Sampling.of(params) if params is not None else Sampling(temperature=1.0)
        prompt_ids = getattr(output, "prompt_token_ids", None)
        for completion in getattr(output, "outputs", ()) or ():
            ids = tuple(int(t) for t in completion.token_ids)
            store.add(
                Sampled(
                    call=number,
                    step=step,
                    prompt_ids=tuple(int(t) for t in prompt_ids) if prompt_ids is not None else None,
                    prompt_text=None,
                    completion_ids=ids,
                    logprobs=sampled_logprobs(ids, getattr(completion, "logprobs", None)),
                    sampling=sampling,
                    engine=engine,
                )
            )
