"""reward-model-zero3: a model as GRPO reward function works under DeepSpeed ZeRO-3.

Main-branch builds: 0.17.0.dev0 builds from before PR #3326, commit 89556c8cb have the bug too.

The bug (TRL issue #3202; fixed by PR #3326 in 0.17.0): under ZeRO-3, a reward model given as a
path (``reward_funcs="org/reward-model"``) is loaded by ``AutoModelForSequenceClassification.
from_pretrained`` inside DeepSpeed's ``zero.Init``, so every rank holds only its shard and the
module's own weights are empty. GRPOTrainer then only calls
``accelerator.prepare_model(reward_func, evaluation_mode=True)``, which attaches no DeepSpeed
engine: nothing gathers the weights before a forward. The first reward computation dies in the
embedding, ``AssertionError: Padding_idx must be within num_embeddings`` (an empty weight with
``padding_idx > 0``). TRL 0.17.0 prepares it with
``prepare_deepspeed`` like the reference model.

Where it shows: TRL 0.14.0 - 0.16.1 (and main-branch builds up to PR #3326) with deepspeed installed
and ZeRO stage 3 in use.

Probe: the source of ``GRPOTrainer.__init__`` prepares reward models with
``self.accelerator.prepare_model(reward_func, evaluation_mode=True)`` and never with
``prepare_deepspeed``.

Fix: after ``GRPOTrainer.__init__``, under ZeRO stage 3 only (stages 1-2 load whole weights, and
TRL's path works), each ``PreTrainedModel`` reward function is given to TRL's own
``prepare_deepspeed`` (what 0.17.0 does): a ZeRO-3 inference engine whose hooks, registered on
the model's modules, gather each layer's weights for its forward. The model itself stays in
``reward_funcs`` (TRL 0.14 scores only ``PreTrainedModel`` instances as models, and names them
from ``config``); its engine is kept in ``trainer._trl_compat_reward_engines``.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.17.0 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers import zero3
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "reward-model-zero3"

ACCELERATE_ONLY = "self.reward_funcs[i] = self.accelerator.prepare_model(reward_func, evaluation_mode=True)"


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if "prepare_deepspeed(reward_func" in source:
        return not_needed("GRPOTrainer.__init__ prepares reward models with prepare_deepspeed")
    if ACCELERATE_ONLY in source:
        if not hasattr(module, "prepare_deepspeed"):
            return undecided(
                "GRPOTrainer.__init__ leaves reward models unprepared for ZeRO-3, but its module "
                "has no prepare_deepspeed to fix that with"
            )
        return needed(
            "GRPOTrainer.__init__ prepares reward models with accelerator.prepare_model only: under "
            "ZeRO-3 their weights stay partitioned and the first reward forward fails"
        )
    return undecided("GRPOTrainer.__init__ prepares reward models in a form trl_compat does not know")


def _prepare_reward_models(module, trainer) -> None:
    from transformers import PreTrainedModel  # already imported by TRL

    if zero3.config_stage(trainer) != 3:
        return
    engines = []
    for reward_func in getattr(trainer, "reward_funcs", None) or ():
        if isinstance(reward_func, PreTrainedModel):
            engines.append(module.prepare_deepspeed(reward_func, trainer.accelerator))
    trainer._trl_compat_reward_engines = engines


def apply(module, patcher):
    around_init(after=lambda trainer, arguments: _prepare_reward_models(module, trainer))(module, patcher)
