"""What the transformers-5 patches share: their window, TRL releases trl_compat supports (< 0.20,
and the 0.20.0.dev0 builds that still carry 0.19's code) on transformers 5, and so when to delete
them. Each finds a different bug, with its own probe; this is only where they agree."""

from __future__ import annotations

from trl_compat._engine import Patch, affected

# tests/engine/test_windows.py: the transformers versions inside and outside that window.
TRANSFORMERS_VERSIONS = {"inside": ["5.0.0"], "outside": ["4.57.0"]}


def patch(**fields) -> Patch:
    """``Patch(**fields)`` in the shared window, with the shared deletion condition."""
    return Patch(requires={"trl": affected("0.14.0", "0.20.0"), "transformers": affected("5.0.0")},
                 remove_when="trl_compat drops TRL < 0.20 on transformers 5", **fields)
