"""Check L: vLLM's log-probs of the sampled tokens against the trainer's."""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple


def ask_for_logprobs(args: tuple, kwargs: dict) -> Optional[Callable[[], None]]:
    """Where the caller did not ask vLLM for log-probs, ask (``logprobs=0``); returns how to undo it."""
    return None


def sampled_logprobs(ids: Tuple[int, ...], logprobs: Any) -> Optional[Tuple[float, ...]]:
    """vLLM's log-prob of each sampled token (``logprobs[t][ids[t]].logprob``), or None."""
    if not logprobs or len(logprobs) != len(ids):
        return None
    values = []
    for token, entry in zip(ids, logprobs):
        found = entry.get(token) if isinstance(entry, dict) else None
        if found is None:
            return None
        values.append(float(getattr(found, "logprob", found)))
    return tuple(values)


def compare(trainer: Any, rows: list) -> None:
    """L on the matched rows: ``[(sampled, trainer_logps_row (1-D tensor of the completion's tokens))]``."""
