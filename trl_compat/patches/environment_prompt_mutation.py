"""environment-prompt-mutation: the environments loop appended each reset observation to the caller's prompt.

The bug (PR #6364, ``66d9b8da7``, fixed in 1.9.0): with ``environment_factory`` (from 0.29.0),
``GRPOTrainer._generate_and_score_completions`` takes ``prompts = [x["prompt"] for x in inputs]`` and,
for each environment whose ``reset`` returns an observation, runs ``prompt[-1]["content"] +=
observation``: the last message of the example it was handed is changed in place (a list content is
extended in place). Whoever holds those examples sees them grow: a second call on the same examples
(a subclass or loop that scores a batch again) generates from, and hands the reward functions, prompts
that carry the observation twice, three times, ... In a plain ``trainer.train()`` the examples are the
per-batch containers that accelerate's dataloader builds, so the dataset itself is not reached.

Upstream fix: the loop rebuilds the last message, ``prompts[i] = prompt[:-1] + [{**prompt[-1],
"content": content + observation}]``, and leaves the example untouched.

Probe: ``GRPOTrainer._generate_and_score_completions`` holds ``prompt[-1]["content"] += observation``:
"needed"; the rebuilt form, or no environments loop (TRL < 0.29.0): "not needed"; an environments loop
written otherwise: "undecided".

Fix: in a run with environments (``environments`` or ``environment_factories`` set), TRL is handed
shallow copies of the examples whose ``prompt`` is a new list ending in a copy of the last message (a
list content copied too), so the in-place ``+=`` lands on the copy, as 1.9.0's rebuilt message does.
Other keys TRL writes into an example (1.x merges ``rollout_func`` fields into ``inputs``) are written
back to the caller's example, as TRL did before. Left as the release has it: ``environment.reset``
receives the copy, so an environment that keeps the ``prompt`` it was reset with sees its observation
appended to it (1.9.0 hands it the untouched original).

Run time: load-bearing: errors propagate. The copies are what TRL generates from: falling back to
TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 1.9.0 (the registry's ``remove_when``; a test holds
the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

METHOD = "_generate_and_score_completions"
BUGGY = 'prompt[-1]["content"] += observation'
FIXED = 'prompts[i] = prompt[:-1] + [{**prompt[-1], "content": content + observation}]'


def probe(module):
    source = code(getattr(module.GRPOTrainer, METHOD))
    if BUGGY in source:
        return needed(
            f"GRPOTrainer.{METHOD} runs {BUGGY}: the caller's prompt is changed in place; "
            "TRL is handed copies of the examples' last messages"
        )
    if FIXED in source or "environment.reset" not in source:
        return not_needed(f"GRPOTrainer.{METHOD} leaves the input prompts untouched (or has no environments loop)")
    return undecided(f"GRPOTrainer.{METHOD} adds the reset observation in a way this patch does not know")


def _with_own_last_message(example):
    """A shallow copy of ``example`` whose conversational prompt ends in a message of its own."""
    prompt = example.get("prompt") if isinstance(example, dict) else None
    if not (isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict) and "content" in prompt[-1]):
        return example  # not a conversation: TRL's loop cannot append to it either
    content = prompt[-1]["content"]
    last = {**prompt[-1], "content": list(content) if isinstance(content, list) else content}
    return {**example, "prompt": prompt[:-1] + [last]}


def _write_back(original, copy) -> None:
    """Keys other than the prompt that TRL set on the copy go to the caller's example, as before."""
    if copy is original:
        return
    for key, value in copy.items():
        if key != "prompt" and (key not in original or original[key] is not value):
            original[key] = value


def _wrap(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        bound = inspect.signature(original).bind(self, *args, **kwargs)
        inputs = bound.arguments.get("inputs")
        with_environments = getattr(self, "environments", None) or getattr(self, "environment_factories", None)
        if not with_environments or not isinstance(inputs, list):
            return original(*bound.args, **bound.kwargs)
        copies = [_with_own_last_message(example) for example in inputs]
        bound.arguments["inputs"] = copies
        output = original(*bound.args, **bound.kwargs)
        for example, copy in zip(inputs, copies):
            _write_back(example, copy)
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap)
