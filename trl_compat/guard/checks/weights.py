"""Checks W1 (what each weight sync sent) and W2 (the weights vLLM holds at generate)."""

from __future__ import annotations

from typing import Any, Tuple


def engine_built(engine: Any) -> None:
    """An in-process engine was built (W2's calibration may start here)."""


def audit_sync(engine: Any, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """Called with ``load_weights``' arguments before vLLM sees them; returns them (wrapped where a
    generator must be recorded as it is consumed)."""
    return args, kwargs


def before_generate(engine: Any) -> None:
    """W2: compare what vLLM holds with the last sync."""
