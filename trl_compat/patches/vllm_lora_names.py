"""vllm-lora-names: with LoRA + ``use_vllm``, TRL 0.14.0 sends vLLM PEFT parameter names.

The bug (TRL issue #2698; vLLM issue #12961; fixed by PR #2725 in 0.15.0): GRPOTrainer pushes
``unwrapped_model.state_dict()`` into vLLM's ``load_weights`` as it is. For a PeftModel the
names are ``base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight``,
``...lora_A.default.weight`` and so on, and vLLM fails with ``ValueError: There is no module
or parameter named 'base_model' in Qwen2ForCausalLM``. Even with the names fixed, the adapter
is never merged, so vLLM would sample from the base model.

The same sync sends a ``torch_compile=True`` policy under its compile wrapper's names
(``_orig_mod.model.layers.0...``), and vLLM fails with ``ValueError: There is no module or parameter
named '_orig_mod'`` (PR #2750, ``bd946f93c``, fixed in 0.15.0, which unwraps it). This patch's sync
reads ``trainer.model`` with every wrapper peeled, so it ends both.

Where it shows: TRL 0.14.0 (sync inline in ``compute_loss``) and main-branch 0.15.0.dev0 builds
before PR #2725 (``81221661c``): inline in ``_prepare_inputs`` from PR #2762, in a
``_move_model_to_vllm`` method from PR #2817.

Probe: the ``trl.trainer.grpo_trainer`` source sends weights (``load_weights(``) but never
strips ``removeprefix("base_model.model.")``; and the sync site is one we can hook: a
``_move_model_to_vllm`` method, or ``compute_loss`` / ``_prepare_inputs`` holding the inline
sync with its ``self.state.global_step != self._last_loaded_step`` guard.

Fix: trl_compat's one sync path (:mod:`trl_compat._helpers.vllm_sync`, shared with
``vllm-merged-weights``): base names, merged weights computed out of place one layer at a
time, training weights untouched. There is no method to replace in 0.14.0, so the method
holding the inline sync is wrapped: when a load is due we sync first and set
``_last_loaded_step``, and TRL's own inline code then skips the step (it would also have
gathered the whole model under ZeRO-3). This runs on every rank, so ZeRO-3's collective
gathers stay in step, which fixing it inside vLLM's ``load_weights`` (main process only)
could not do. Anything the sync does not recognise falls back to TRL's own code.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.15.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

SEND = "load_weights("
STRIP = 'removeprefix("base_model.model.")'
DUE = "self.state.global_step != self._last_loaded_step"
DONE = "self._last_loaded_step = self.state.global_step"


def sync_site(cls):
    """``("method", name)`` for a ``_move_model_to_vllm`` to replace, ``("inline", name)``
    for the method holding the inline sync, or ``None``."""
    if "_move_model_to_vllm" in vars(cls) and SEND in code(vars(cls)["_move_model_to_vllm"]):
        return "method", "_move_model_to_vllm"
    for name in ("compute_loss", "_prepare_inputs"):
        if name in vars(cls):
            source = code(vars(cls)[name])
            if SEND in source and DUE in source and DONE in source:
                return "inline", name
    return None


def probe(module):
    source = code(module)
    if SEND not in source:
        return not_needed("this GRPOTrainer does not push weights into a colocated vLLM")
    if STRIP in source:
        return not_needed("GRPOTrainer strips PEFT names before vLLM's load_weights (fixed in 0.15.0)")
    site = sync_site(module.GRPOTrainer)
    if site is None:
        return undecided("PEFT names reach vLLM's load_weights, but the sync site is not one this patch can hook")
    return needed(
        f"GRPOTrainer.{site[1]} sends PeftModel.state_dict() to vLLM's load_weights unmerged "
        "and with PEFT names ('base_model.model.', '.base_layer', lora_A/lora_B)"
    )


def apply(module, patcher):
    from trl_compat._helpers import vllm_sync

    kind, name = sync_site(module.GRPOTrainer)
    factory = vllm_sync.make_move_model_to_vllm if kind == "method" else vllm_sync.make_presync
    patcher.wrap(module.GRPOTrainer, name, factory)
