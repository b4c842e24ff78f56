"""colocate-generation-kwargs: TRL 0.19.0's colocated vLLM dies at the first generation with the default
``generation_kwargs``.

The bug (PR #3634, ``84982ad79``, fixed in 0.19.1): 0.19.0 added ``GRPOConfig.generation_kwargs``
(default ``None``); ``_generate_and_score_completions`` builds vLLM's sampling settings for
``vllm_mode="colocate"`` with ``generation_kwargs.update(self.args.generation_kwargs)`` without the
``None`` check the transformers path (``__init__``) has, so every colocated run that does not pass
``generation_kwargs`` stops at its first step: ``TypeError: 'NoneType' object is not iterable``.

Upstream fix: ``if self.args.generation_kwargs is not None:`` before that ``update``.

Probe: ``GRPOTrainer._generate_and_score_completions`` calls
``generation_kwargs.update(self.args.generation_kwargs)`` more often than it checks
``self.args.generation_kwargs is not None``: "needed"; every call checked (0.19.1), or no such call
(the other releases): "not needed".

Fix: after TRL's ``__init__``, a colocated run (``use_vllm``, ``vllm_mode="colocate"``) whose
``args.generation_kwargs`` is ``None`` gets ``{}``, which adds nothing to the sampling settings, as
``None`` does from 0.19.1 on. Server mode and transformers generation, which handle ``None``, are
left alone.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.19.0 (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

METHOD = "_generate_and_score_completions"
UPDATES = "generation_kwargs.update(self.args.generation_kwargs)"
CHECKED = "if self.args.generation_kwargs is not None"


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    source = code(method) if method is not None else ""
    if source.count(UPDATES) > source.count(CHECKED):
        return needed(
            f"GRPOTrainer.{METHOD} merges args.generation_kwargs into the colocated vLLM's sampling settings without a "
            "None check: with the default None the first generation raises TypeError; a colocated run gets {} instead"
        )
    return not_needed("args.generation_kwargs=None is checked before it is merged (or never merged here)")


def _empty_where_none(trainer, arguments) -> None:
    args = getattr(trainer, "args", None)
    colocated = getattr(args, "use_vllm", False) and getattr(args, "vllm_mode", None) == "colocate"
    if args is not None and colocated and getattr(args, "generation_kwargs", "absent") is None:
        args.generation_kwargs = {}


apply = around_init(after=_empty_where_none)
