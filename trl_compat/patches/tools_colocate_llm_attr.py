"""tools-colocate-llm-attr: tools + colocated vLLM crash in TRL 0.28.0 - 0.29.0's tool loop.

Upstream: fixed in 0.29.1 by PR #5302, commit 0007dc23b.

The bug (TRL #5301): PR #4700 (0.28.0) moved the colocated engine from ``GRPOTrainer.llm`` to
``GRPOTrainer.vllm_generation.llm``, but ``GRPOTrainer._tool_call_loop`` still reads
``self.llm.llm_engine.model_config.max_model_len`` when ``use_vllm`` and
``vllm_mode == "colocate"``. The first batch with a tool call raises
``AttributeError: 'GRPOTrainer' object has no attribute 'llm'``. Where it shows: TRL 0.28.0 - 0.29.0
(and main-branch builds between #4700 and #5302), with ``tools=[...]`` and colocated vLLM, on
transformers >= 5 (these releases refuse ``tools`` on transformers < 5 with an ImportError, so the
window requires transformers 5).

Probe: "needed" where ``GRPOTrainer._tool_call_loop`` reads ``self.llm.llm_engine`` while nothing
in ``GRPOTrainer.__init__`` assigns ``self.llm`` and ``__init__`` builds ``self.vllm_generation``;
"not needed" where the tool loop reads ``self.vllm_generation.llm`` (0.29.1) or ``self.llm`` is
still the trainer's own engine (0.26 - 0.27); any other reading is "undecided".

Fix: a read-only ``llm`` property on ``GRPOTrainer`` returning the instance's own ``llm`` if it has
one, else ``self.vllm_generation.llm``; without either it raises ``AttributeError`` as before, so
``hasattr(trainer, "llm")`` is unchanged outside colocate mode (no TRL 0.28 / 0.29.0 code tests
it: read at both tags, subclasses in ``trl/experimental`` included). Assigning ``trainer.llm``
stores on the instance, which the property then returns.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.28.x and 0.29.0 are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code


def probe(module):
    cls = module.GRPOTrainer
    loop = code(cls._tool_call_loop)
    init = code(cls.__init__)
    if "self.vllm_generation.llm" in loop:
        return not_needed("GRPOTrainer._tool_call_loop reads the engine at self.vllm_generation.llm (PR #5302)")
    if "self.llm.llm_engine" not in loop:
        return undecided("GRPOTrainer._tool_call_loop does not read self.llm.llm_engine: unknown engine access")
    if "self.llm =" in init:
        return not_needed("GRPOTrainer.__init__ still sets self.llm, which the tool loop reads")
    if "self.vllm_generation =" not in init:
        return undecided("GRPOTrainer.__init__ sets neither self.llm nor self.vllm_generation: unknown engine location")
    return needed(
        "GRPOTrainer._tool_call_loop reads self.llm, but the colocated engine lives at self.vllm_generation.llm: "
        "tools + vllm_mode='colocate' raise AttributeError; the patch adds a read-only llm property"
    )


def _llm(self):
    own = vars(self).get("llm")
    if own is not None:
        return own
    generation = vars(self).get("vllm_generation")
    engine = getattr(generation, "llm", None)
    if engine is None:
        raise AttributeError(f"'{type(self).__name__}' object has no attribute 'llm'")
    return engine


def _set_llm(self, value):
    vars(self)["llm"] = value


def apply(module, patcher):
    patcher.replace(module.GRPOTrainer, "llm", property(_llm, _set_llm, doc="The colocated vLLM engine (trl_compat)."))
