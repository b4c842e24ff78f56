"""What vLLM was asked and returned, kept until the loss uses the completions (floor 1).

Completions are matched to the loss's rows by their token ids: the ids vLLM returned are the ids
TRL trains on (padded, masked after the first EOS), whatever TRL does in between (the main-rank
generation and broadcast of 0.14 - 0.17, ``process_slice``, the 0.18+ buffering of several steps'
inputs, ``num_iterations``). A completion whose ids occur twice with different prompts is
ambiguous and never compared. Rows TRL builds from several vLLM outputs (tool-call turns) match
nothing and are not compared either.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trl_compat.guard._engines import EngineRecord

MAX_PENDING = 16384  # completions kept for matching: a few steps' worth of any batch size


@dataclass(frozen=True)
class Sampling:
    """The sampling parameters one generate call used, as far as the loss's policy depends on them."""

    temperature: float | None
    top_k: int | None = None  # None, 0 or -1: off
    top_p: float | None = None
    min_p: float | None = None
    penalties: tuple[str, ...] = ()  # names of active repetition/presence/frequency penalties
    guided: bool = False  # guided decoding, structured outputs or logits processors
    logprobs: bool = False  # whether the caller asked for log-probs

    @classmethod
    def of(cls, params: Any) -> Sampling:
        """The loss-relevant part of a ``SamplingParams`` (or of a dict of its fields)."""
        get = params.get if isinstance(params, dict) else lambda name, default=None: getattr(params, name, default)
        penalties = tuple(
            f"{name}={get(name)}"
            for name, neutral in (("repetition_penalty", 1.0), ("presence_penalty", 0.0), ("frequency_penalty", 0.0))
            if get(name) not in (None, neutral)
        )
        guided = any(get(name) is not None for name in ("guided_decoding", "structured_outputs", "guided_decoding_regex"))
        temperature = get("temperature")
        return cls(
            temperature=float(temperature) if temperature is not None else None,
            top_k=get("top_k"),
            top_p=get("top_p"),
            min_p=get("min_p"),
            penalties=penalties,
            guided=guided or bool(get("logits_processors")),
            logprobs=get("logprobs") is not None,
        )

    def truncated(self) -> tuple[str, ...]:
        """The settings that make generation deliberately differ from the full-vocabulary policy."""
        found = []
        if self.top_k not in (None, 0, -1):
            found.append(f"top_k={self.top_k}")
        if self.top_p not in (None, 1.0):
            found.append(f"top_p={self.top_p}")
        if self.min_p not in (None, 0.0):
            found.append(f"min_p={self.min_p}")
        found.extend(self.penalties)
        if self.guided:
            found.append("guided decoding / logits processors")
        return tuple(found)


@dataclass
class Sampled:
    """One completion vLLM generated."""

    call: int  # the guard's number of the generate call that made it
    step: int  # the optimizer step it was generated at
    prompt_ids: tuple[int, ...] | None  # what vLLM generated from (None: only the text is known)
    prompt_text: str | None  # the text sent, where vLLM tokenised it in another process
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None  # vLLM's log-prob of each sampled token
    sampling: Sampling
    engine: EngineRecord | None = None  # the guard's record of the engine (in-process), or None (server)
    truncate: int | None = None  # the server keeps the last this many ids of the prompt it tokenises
    prompt_checked: bool = False
    logprobs_checked: bool = False


class Pending:
    """The completions not yet matched, by their token ids."""

    def __init__(self, limit: int = MAX_PENDING) -> None:
        self._lock = threading.Lock()
        self._order: collections.deque[tuple[int, ...]] = collections.deque()
        self._by_ids: dict[tuple[int, ...], Sampled] = {}
        self._ambiguous: set[tuple[int, ...]] = set()
        self._limit = limit

    def add(self, sampled: Sampled) -> None:
        key = sampled.completion_ids
        with self._lock:
            known = self._by_ids.get(key)
            if known is not None:
                # the same completion again: of the same prompt, the newer one is what the loss gets next
                if (known.prompt_ids, known.prompt_text) != (sampled.prompt_ids, sampled.prompt_text):
                    self._ambiguous.add(key)
                elif known.call != sampled.call:
                    self._by_ids[key] = sampled
                return
            self._by_ids[key] = sampled
            self._order.append(key)
            while len(self._order) > self._limit:
                old = self._order.popleft()
                self._by_ids.pop(old, None)
                self._ambiguous.discard(old)

    def find(self, completion_ids: tuple[int, ...]) -> Sampled | None:
        with self._lock:
            if completion_ids in self._ambiguous:
                return None
            return self._by_ids.get(completion_ids)

    def clear(self) -> None:
        with self._lock:
            self._order.clear()
            self._by_ids.clear()
            self._ambiguous.clear()


@dataclass
class Batch:
    """Check L's figures of one generation batch (one generate call) of one run, until decided."""

    call: int
    step: int
    tau: float
    precision: str
    kl: list[float] = field(default_factory=list)  # m_i per completion
    abs_diff: float = 0.0  # sum of |Δ| over tokens
    diff: float = 0.0  # sum of Δ
    tokens: int = 0
