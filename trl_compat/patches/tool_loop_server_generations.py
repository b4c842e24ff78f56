"""tool-loop-server-generations: with tools and ``vllm_mode="server"``, the tool loop's post-tool turns
are generated for the wrong samples.

The bug: after a tool call, ``GRPOTrainer._tool_call_loop`` builds one history per sample (its prompt,
its own completion, its tool result) and calls ``self._generate_single_turn`` with those histories.
That method generates as for a fresh batch of prompts: ``num_generations = self.num_generations if
mode == "train" else self.num_generations_eval``, passed to ``VLLMGeneration.generate``, whose server
path assumes every prompt repeated ``num_generations`` times: it sends ``all_prompts[::num_generations]``
with ``n=num_generations`` and hands the ``n`` completions of each history it kept to that history and
the ``num_generations - 1`` samples after it. So only every ``num_generations``-th history is continued;
the other samples get a continuation of a neighbour's conversation (and when the tool-calling samples
are not a multiple of ``num_generations`` they get fewer completions than histories). The loss trains
each sample on tokens sampled for another history; no error. Colocate mode ignores ``num_generations``
(one completion per prompt) and the paths without vLLM do not read it.

Where it shows: TRL 1.0.0 - 1.14.0. The tool loop refused server mode before PR #5235 (``c0e3fb0c5``,
first released in 1.0.0: ``NotImplementedError: Unsupported mode detected``, 0.26.0 - 0.29.x and the
1.0.0.dev0 builds before it); 0.26 - 0.28's ``VLLMClient.chat`` also raised on any tools. Fixed in
TRL 1.14.1 (its grpo_trainer.py, between the 1.14.0 and 1.14.1 wheels): ``_generate_single_turn``
takes ``num_generations`` as an argument and the tool loop passes ``num_generations=1``.

Probe: "not needed" where ``GRPOTrainer`` has no ``_tool_call_loop`` (TRL < 0.26), where the loop
names ``num_generations`` (1.14.1 on: it passes 1), or where it raises "Unsupported mode detected"
without a server branch (the loop refuses server mode). "Needed" where the loop calls
``self._generate_single_turn(`` and names no ``num_generations``, ``_generate_single_turn`` reads
``self.num_generations`` / ``self.num_generations_eval`` only in that one line and passes the result
on (``num_generations=num_generations``), ``_get_tool_suffix_ids`` (where present) does not read it,
and ``VLLMGeneration.generate`` keeps ``[::num_generations]`` of the gathered prompts. Any other shape:
"undecided".

Fix: ``GRPOTrainer._tool_call_loop`` is wrapped: for the duration of the call the trainer's
``num_generations`` and ``num_generations_eval`` read 1 (restored afterwards, also on an error), so each
post-tool turn asks for one completion per history, every history sent: what 1.14.1's
``num_generations=1`` does. The probe checked that nothing else the loop runs reads either attribute.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 1.0.0 - 1.14.0 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, normalise

LOOP = "_tool_call_loop"
ATTRIBUTES = ("num_generations", "num_generations_eval")
CALL = "self._generate_single_turn("
READ = 'num_generations = self.num_generations if mode == "train" else self.num_generations_eval'
PASSED = "num_generations=num_generations"
REFUSED = "Unsupported mode detected"
SERVER_BRANCH = 'self.vllm_mode == "server"'
KEEPS_EVERY_NTH = "all_prompts[::num_generations]"


def probe(module):
    trainer = module.GRPOTrainer
    loop = getattr(trainer, LOOP, None)
    if loop is None:
        return not_needed("GRPOTrainer has no tool-calling loop")
    loop_code = code(loop)
    if "num_generations" in loop_code:
        return not_needed("the tool loop passes its own num_generations to _generate_single_turn")
    if REFUSED in loop_code and SERVER_BRANCH not in loop_code:
        return not_needed("the tool loop refuses vllm_mode='server' (NotImplementedError)")
    if CALL not in loop_code:
        return undecided("GRPOTrainer._tool_call_loop generates in a way this patch does not know")
    single = code(trainer._generate_single_turn)
    if READ not in single or PASSED not in single:
        return undecided("GRPOTrainer._generate_single_turn reads num_generations in a way this patch does not know")
    if "self . num_generations" in str(single).replace(normalise(READ), ""):
        return undecided("GRPOTrainer._generate_single_turn reads num_generations more than once")
    suffix = getattr(trainer, "_get_tool_suffix_ids", None)
    if suffix is not None and "num_generations" in code(suffix):
        return undecided("GRPOTrainer._get_tool_suffix_ids reads num_generations")
    generation = getattr(module, "VLLMGeneration", None)
    if generation is None:
        return undecided("no VLLMGeneration in the trainer's module: the server path is not where this patch looks")
    if KEEPS_EVERY_NTH not in code(generation.generate):
        return undecided("VLLMGeneration.generate does not keep every num_generations-th prompt as this patch knows")
    return needed(
        "the tool loop's post-tool turns go through _generate_single_turn with the trainer's num_generations: "
        "in server mode every num_generations-th history is sent with n=num_generations; the loop gets 1"
    )


def _wrap_loop(loop):
    @functools.wraps(loop)
    def _tool_call_loop(self, *args, **kwargs):
        # every sample has its own history in the loop: one completion each, as TRL 1.14.1 passes 1
        state = vars(self)
        saved = {name: state[name] for name in ATTRIBUTES if name in state}
        for name in saved:
            setattr(self, name, 1)
        try:
            return loop(self, *args, **kwargs)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    return _tool_call_loop


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, LOOP, _wrap_loop)
