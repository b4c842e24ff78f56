"""tool-iterations-zero: ``max_tool_calling_iterations=0`` runs the tool loop without limit.

The bug (PR #6423, ``c24964d0a``, fixed in 1.9.0): ``GRPOTrainer.__init__`` reads the setting as
``args.max_tool_calling_iterations or sys.maxsize`` (from 0.27.0, when the setting arrived), so an
explicit 0, "no tool calls", is falsy and becomes ``sys.maxsize``: the tool loop (``while
idxs_with_tool and iteration_num < self.max_tool_calling_iterations``) runs every tool the model
calls and generates again, turn after turn, until no completion calls a tool or the length budget is
spent. A run meant to train single-turn answers trains on multi-turn tool conversations; no error.

Upstream fix: ``args.max_tool_calling_iterations if args.max_tool_calling_iterations is not None else
sys.maxsize``.

Probe: ``GRPOTrainer.__init__`` holds ``args.max_tool_calling_iterations or sys.maxsize``: "needed";
the fixed ``is not None`` form, or a release without the setting: "not needed"; the setting read in
another way: "undecided".

Fix: after TRL's ``__init__``, a trainer whose ``args.max_tool_calling_iterations`` is 0 gets
``max_tool_calling_iterations = 0``, as 1.9.0 sets it; ``None`` (no limit) and every other value are
left as TRL set them.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.9.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

SETTING = "max_tool_calling_iterations"
BUGGY = "args.max_tool_calling_iterations or sys.maxsize"
FIXED = "args.max_tool_calling_iterations is not None"


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if BUGGY in source:
        return needed(
            f"GRPOTrainer.__init__ reads {BUGGY}: an explicit 0 becomes sys.maxsize, so the tool loop has no limit; "
            "the trainer gets 0 back after __init__"
        )
    if FIXED in source or SETTING not in source:
        return not_needed(f"GRPOTrainer.__init__ keeps {SETTING}=0 as 0 (or has no such setting)")
    return undecided(f"GRPOTrainer.__init__ reads {SETTING} in a way this patch does not know")


def _zero_is_zero(trainer, arguments) -> None:
    if getattr(getattr(trainer, "args", None), SETTING, None) == 0:
        setattr(trainer, SETTING, 0)


apply = around_init(after=_zero_is_zero)
