"""vllm-merged-weights: with LoRA + ``use_vllm``, TRL 0.15.0 sends vLLM the base weights.

The bug (TRL issue #2856, fixed by PR #2873 in 0.15.1): ``GRPOTrainer._move_model_to_vllm``
does ``merge_adapter()``, takes ``state_dict()``, ``unmerge_adapter()`` and only then calls
vLLM's ``load_weights``. ``state_dict()`` shares storage with the parameters, so the unmerge
has already reverted the values: vLLM generates from the base model at every step, with no
error; the reward curve stays flat.

Where it shows: TRL 0.15.0, and main-branch builds from PR #2725 (``81221661c``, 0.15.0.dev0) up
to PR #2873 (``822653824``, by then 0.16.0.dev0). 0.15.1 moved the unmerge after the load.

Probe: in the source of ``GRPOTrainer._move_model_to_vllm`` the first ``unmerge_adapter()``
comes before the first ``load_weights(``. The version window (0.15.0.dev0 up to 0.16.0, main's
fix landed among the 0.16.0.dev0 builds) includes 0.15.1/0.15.2, where the probe finds the fixed order and reports "not needed".

Fix: ``_move_model_to_vllm`` is replaced by trl_compat's one sync path
(:mod:`trl_compat._helpers.vllm_sync`, shared with ``vllm-lora-names``): vLLM gets base names and
merged weights computed out of place, one layer at a time, so unlike upstream's fix the
training weights stay bit-identical and no second copy of the model is made. Anything the
sync does not recognise falls back to TRL's own method.

Main-branch builds: 0.16.0.dev0 builds older than PR #2873 have the bug too.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL < 0.15.1 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code, normalise

SENDS = ("load_weights(", "update_named_param(")
UNMERGE = "unmerge_adapter()"


def probe(module):
    cls = module.GRPOTrainer
    if "_move_model_to_vllm" not in vars(cls):
        return not_needed("GRPOTrainer does not define _move_model_to_vllm")
    source = code(vars(cls)["_move_model_to_vllm"])
    sends = [i for i in (source.find(normalise(s)) for s in SENDS) if i >= 0]
    if not sends:
        return undecided("GRPOTrainer._move_model_to_vllm sends weights in a way this probe does not know")
    unmerge = source.find(normalise(UNMERGE))
    if unmerge < 0:
        return not_needed("_move_model_to_vllm does not merge/unmerge a PEFT adapter")
    if unmerge < min(sends):
        return needed(
            "_move_model_to_vllm calls unmerge_adapter() before vLLM's load_weights(): "
            "vLLM receives the base weights, not the merged ones"
        )
    return not_needed("_move_model_to_vllm unmerges the adapter after load_weights() (fixed in 0.15.1)")


def apply(module, patcher):
    from trl_compat._helpers import vllm_sync

    patcher.wrap(module.GRPOTrainer, "_move_model_to_vllm", vllm_sync.make_move_model_to_vllm)
