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
import itertools
import logging
import threading
import weakref
from typing import Any, Callable, Optional

from trl_compat._engine import guarded
from trl_compat.guard import _instances, _trainers
from trl_compat.guard._alarms import LEDGER
from trl_compat.guard._records import Sampled, Sampling, pending
from trl_compat.guard.checks import engine_calls, logprobs, weights

log = logging.getLogger("trl_compat.guard")
GUARD_ID = "offpolicy-guard"
MODEL_PATHS = (
    ("llm_engine", "model_executor", "driver_worker", "model_runner", "model"),  # V0; V1 colocate (TRL's own path)
    ("llm_engine", "model_executor", "driver_worker", "worker", "model_runner", "model"),  # V1 in process (vLLM 0.9+)
)
_calls = itertools.count(1)
_calls_lock = threading.Lock()


class Engine:
    """What the guard knows of one in-process vLLM engine (see checks.engine_calls for its states)."""

    def __init__(self, llm: Any, prefix_caching: Optional[bool]) -> None:
        self.llm = weakref.ref(llm) if llm is not None else None  # None: a server's engine, seen from its client
        self.prefix_caching = prefix_caching
        self.model = _engine_model(llm) if llm is not None else None
        self.state = "checkpoint"  # checkpoint | synced | disk | discarded | lost
        self.asleep: Optional[int] = None  # the sleep level while asleep
        self.synced_while_asleep = False
        self.prefix_dirty = False
        self.generates = 0
        self.syncs = 0  # load_weights calls of the trainer's weight syncs
        self.inside: list = []  # the engine calls in progress (a load_weights inside one is vLLM's own)
        self.own_loads = 0  # load_weights calls vLLM made itself (reload_weights reads the checkpoint through it)
        self.trainer: Optional["weakref.ref[Any]"] = None  # the trainer that syncs into this engine
        self.last_sync_step = -1
        self.logprobs_mode = _logprobs_mode(llm) if llm is not None else None


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


def _logprobs_mode(llm: Any) -> Optional[str]:
    config = getattr(getattr(llm, "llm_engine", None), "model_config", None)
    mode = getattr(config, "logprobs_mode", None) or getattr(llm, "logprobs_mode", None)
    return str(getattr(mode, "value", mode)) if mode is not None else None


def _prefix_caching(llm: Any, arguments: dict) -> Optional[bool]:
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
        signature: Optional[inspect.Signature] = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        with guarded(GUARD_ID, "instrumenting a vLLM engine", fallback="this engine is not guarded", logger=log):
            arguments = _bind(signature, (self, *args), kwargs)
            instrument(self, _prefix_caching(self, arguments))

    return __init__


def _bind(signature: Optional[inspect.Signature], args: tuple, kwargs: dict) -> dict:
    if signature is None:
        return {}
    try:
        return dict(signature.bind_partial(*args, **kwargs).arguments)
    except TypeError:
        return {}


def instrument(llm: Any, prefix_caching: Optional[bool]) -> Optional[Engine]:
    """Hook one engine (once; a subclass's ``__init__`` calling its base's reaches here twice)."""
    if _instances.instrumented(llm):
        return None
    engine = Engine(llm, prefix_caching)
    for name in ("generate", "chat"):
        _instances.wrap_method(llm, name, functools.partial(_generate_hook, engine, name))
    for name, event in (
        ("reset_prefix_cache", engine_calls.reset_prefix_cache),
        ("sleep", engine_calls.sleep),
        ("wake_up", engine_calls.wake_up),
        ("collective_rpc", engine_calls.collective_rpc),
    ):
        _instances.wrap_method(llm, name, functools.partial(_event_hook, engine, name, event))
    if engine.model is not None:
        _instances.wrap_method(engine.model, "load_weights", functools.partial(_sync_hook, engine))
    weights.engine_built(engine)
    return engine


def _event_hook(engine: Engine, name: str, event: Callable[..., None], call: Callable[..., Any]) -> Callable[..., Any]:
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


def _sync_hook(engine: Engine, call: Callable[..., Any]) -> Callable[..., Any]:
    def load_weights(*args: Any, **kwargs: Any) -> Any:
        if engine.inside:  # vLLM loading its own checkpoint (reload_weights), not a sync of the trainer's
            engine.own_loads += 1
            return call(*args, **kwargs)
        with guarded(GUARD_ID, "recording a weight sync", fallback="the sync is not audited", logger=log):
            args, kwargs = weights.audit_sync(engine, args, kwargs)
        result = call(*args, **kwargs)
        with guarded(GUARD_ID, "recording a weight sync", fallback="the sync is not checked", logger=log):
            engine_calls.synced(engine, _trainers.sync_step(engine))
            weights.after_sync(engine)
        return result

    return load_weights


def _generate_hook(engine: Engine, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
    def generate(*args: Any, **kwargs: Any) -> Any:
        trainer, restore = None, None
        with guarded(GUARD_ID, "checking vLLM before generate", fallback="this generation is not checked", logger=log):
            trainer = _trainers.calling_trainer()
            if trainer is not None:
                _trainers.adopt(trainer)
                engine.trainer = weakref.ref(trainer)
                LEDGER.step = _trainers.global_step(trainer)
            engine_calls.before_generate(engine)
            weights.before_generate(engine)
            restore = logprobs.ask_for_logprobs(args, kwargs)
        try:
            outputs = call(*args, **kwargs)
        finally:
            if restore is not None:
                restore()
        with guarded(GUARD_ID, "recording vLLM's outputs", fallback="this generation is not checked", logger=log):
            if trainer is not None:  # generations of the user's own (eval scripts, ...) are not the loss's
                record_outputs(engine, trainer, outputs, args, kwargs)
        return outputs

    return generate


def sampling_of(params: Any) -> Sampling:
    """The loss-relevant part of a ``SamplingParams`` (or of a dict of its fields)."""
    get = params.get if isinstance(params, dict) else lambda name, default=None: getattr(params, name, default)
    penalties = tuple(
        f"{name}={get(name)}"
        for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0))
        if get(name) not in (None, neutral)
    )
    guided = any(get(name) is not None for name in ("guided_decoding", "structured_outputs", "guided_decoding_regex")) or bool(
        get("logits_processors")
    )
    temperature = get("temperature")
    return Sampling(
        temperature=float(temperature) if temperature is not None else None,
        top_k=get("top_k"),
        top_p=get("top_p"),
        min_p=get("min_p"),
        penalties=penalties,
        guided=guided,
        logprobs=get("logprobs") is not None,
    )


def _params_per_request(args: tuple, kwargs: dict, count: int) -> list:
    params = kwargs.get("sampling_params", args[1] if len(args) > 1 else None)
    if isinstance(params, (list, tuple)):
        return list(params)
    return [params] * count


def next_call() -> int:
    with _calls_lock:
        number = next(_calls)
    LEDGER.generations += 1
    return number


def record_outputs(engine: Optional[Engine], trainer: Any, outputs: Any, args: tuple, kwargs: dict) -> None:
    """Keep each completion of a generate call for matching with the loss's rows."""
    if not isinstance(outputs, (list, tuple)):
        return
    number, step, store = next_call(), LEDGER.step, pending(trainer)
    for output, params in zip(outputs, _params_per_request(args, kwargs, len(outputs))):
        sampling = sampling_of(params) if params is not None else Sampling(temperature=1.0)
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
                    logprobs=logprobs.sampled_logprobs(ids, getattr(completion, "logprobs", None)),
                    sampling=sampling,
                    engine=engine,
                )
            )
