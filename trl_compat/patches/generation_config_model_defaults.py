"""generation-config-model-defaults: on transformers 4.50 - 4.57, ``generate`` swaps TRL's sampling
settings for the model's own generation defaults wherever TRL's value equals the global default.

Upstream: TRL's fix, PR #4647, is commit 3e9ceebfb in 0.26.2 and 8918c9836 on main, in 0.27.0.

The bug (transformers#42762; TRL #5783, PR #4647 "no variance in generated completions"):
transformers#36684 (4.50) and #36881 made ``generate(generation_config=cfg)`` with
``use_model_defaults`` unset, for a model whose ``generation_config.transformers_version`` is
>= 4.50, replace every field of ``cfg`` whose VALUE equals ``GenerationConfig()``'s by the model's
own ``generation_config`` value. Without vLLM (the default) GRPOTrainer samples with
``unwrapped_model.generate(..., generation_config=self.generation_config)``: TRL's
``temperature=1.0`` and ``top_p=1.0`` equal the defaults, so a Qwen3 checkpoint samples at
T=0.6 / top-p 0.95 (a Qwen-VL one at T=1e-6: identical completions, zero reward std), while TRL
computes the log-probs, the ratio and the KL at its own settings (0.16+). Only one transformers warning
line ("`generation_config` default values have been modified to match model-specific
defaults") says so. TRL 0.14 - 0.15 leave ``top_p``/``top_k`` unset (0.16 - 0.19 default
``top_k=50``), so those too come from the model; a TRL value that differs from the global default
(0.14 - 0.17's default ``temperature=0.9``, 0.20+'s ``top_k=None``) is kept. transformers 5 fixed it
(#42702: only fields the caller left unset are filled, and ``use_model_defaults`` is gone).

Where it shows: every TRL from 0.14.0 to 0.26.1 (and 0.27.0.dev0 builds before 8918c9836) on
transformers 4.50.0 - 4.57.x, with a model whose generation_config was saved by transformers
>= 4.50 (Qwen3, Gemma-3, any checkpoint re-saved since 2025-03, any model built in code) and
holds sampling values other than the global defaults.

Probe: transformers' ``GenerationMixin.generate`` takes ``use_model_defaults`` (else "not
needed": transformers < 4.50 or >= 5 do not fill by value), and the one GRPOTrainer method that
samples with transformers (``compute_loss`` in 0.14, ``_prepare_inputs`` in 0.15,
``_generate_and_score_completions`` in 0.16 - 0.23, ``_generate_single_turn`` from 0.24) calls
``unwrapped_model.generate(`` with ``generation_config=self.generation_config`` and neither
passes ``generation_kwargs=self.generation_kwargs`` to the unwrapping (PR #4647's
``_override_model_generation_config``: "not needed") nor ``use_model_defaults``. No such method:
"undecided".

Fix: ``GenerationMixin.generate`` is wrapped; a call made from within that TRL method (its frame
on the stack) whose ``generation_config`` IS that trainer's ``generation_config`` gets
``use_model_defaults=False``, unless the caller passed ``use_model_defaults`` itself. transformers
then takes TRL's config as it is and only fills the bos/eos/pad/decoder-start token ids TRL left
unset from the model, as every transformers < 4.50 did, the behaviour these TRL releases were
written against. For TRL 0.16 - 0.26.1, which set every sampling field (temperature, top_p,
top_k, min_p, repetition_penalty), the sampling distribution is the one TRL 0.26.2's fix gives;
on 0.14 - 0.15 the unset ``top_p``/``top_k`` stay at GenerationConfig's 1.0/50, as on
transformers < 4.50 (0.26.2's fix would inherit them from the model). Arguments are bound by name
and passed through unchanged otherwise. Not opt-in: it does not change the training objective, it
makes generation sample with the settings the user gave TRL and that TRL's loss assumes (what
TRL's own fix does). Not covered: ``use_transformers_paged`` (``generate_batch``, TRL 0.20+, which
does not go through ``generate``), vLLM (no ``generate`` call), TRL's other trainers, and a user
subclass that replaces the sampling method without calling TRL's.

Delete when: trl_compat no longer supports TRL < 0.26.2 on transformers 4.50 - 4.57 (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys

from trl_compat._engine import guarded, needed, not_needed, undecided
from trl_compat._helpers.source import code, defining_class, unwrap

PATCH_ID = "generation-config-model-defaults"
log = logging.getLogger(__name__)

# The GRPOTrainer method that samples with transformers, newest first: 0.24+, 0.16 - 0.23, 0.15, 0.14.
SAMPLING_METHODS = ("_generate_single_turn", "_generate_and_score_completions", "_prepare_inputs", "compute_loss")
GENERATE_CALL = "unwrapped_model.generate("
TRL_CONFIG = "generation_config=self.generation_config"
# PR #4647 passes TRL's kwargs to unwrap_model_for_generation, which overrides model.generation_config
FIXED = ("generation_kwargs=self.generation_kwargs", "use_model_defaults")
_MAX_DEPTH = 64  # frames between generate and TRL's method: PEFT's generate, other patches' wrappers


def _sampling_methods(trainer_cls):
    """``[(name, Code)]`` of the TRL methods of ``trainer_cls`` that sample with TRL's generation_config."""
    found = []
    for name in SAMPLING_METHODS:
        owner = defining_class(trainer_cls, name)
        if owner is None or not owner.__module__.startswith("trl."):
            continue  # Trainer's compute_loss / _prepare_inputs
        source = code(getattr(trainer_cls, name))
        if GENERATE_CALL in source and TRL_CONFIG in source:
            found.append((name, source))
    return found


def _generate_takes_use_model_defaults() -> bool:
    from transformers.generation.utils import GenerationMixin

    return "use_model_defaults" in inspect.signature(GenerationMixin.generate).parameters


def probe(module):
    if not _generate_takes_use_model_defaults():
        return not_needed(
            "transformers' generate has no use_model_defaults: it does not fill TRL's generation config from the model's"
        )
    methods = _sampling_methods(module.GRPOTrainer)
    if not methods:
        return undecided(f"no GRPOTrainer method calls {GENERATE_CALL}..., {TRL_CONFIG}) the way this patch expects")
    for name, source in methods:
        if any(marker in source for marker in FIXED):
            return not_needed(f"GRPOTrainer.{name} makes the model's generation_config TRL's while generating (PR #4647)")
    import transformers

    names = ", ".join(f"GRPOTrainer.{name}" for name, _ in methods)
    return needed(
        f"{names} calls generate(generation_config=self.generation_config) without use_model_defaults: transformers "
        f"{transformers.__version__} replaces each of its fields that equals the global default (temperature=1.0, "
        "top_p=1.0, ...) by the model's generation_config value, so sampling does not follow TRL's settings; "
        "the patch passes use_model_defaults=False to those calls"
    )


def _trl_trainer_on_stack(frame, codes):
    """The ``self`` of the innermost frame of one of TRL's sampling methods (None if none)."""
    for _ in range(_MAX_DEPTH):
        if frame is None:
            return None
        if frame.f_code in codes:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


def _is_trainer_call(signature, codes, frame, args, kwargs) -> bool:
    arguments = signature.bind_partial(*args, **kwargs).arguments
    config = arguments.get("generation_config")
    if config is None or "use_model_defaults" in arguments:
        return False
    trainer = _trl_trainer_on_stack(frame, codes)
    return trainer is not None and getattr(trainer, "generation_config", None) is config


def _wrapper(original, codes):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def generate(*args, **kwargs):
        use_trl_config = False
        with guarded(PATCH_ID, "finding TRL's sampling call", logger=log):
            use_trl_config = _is_trainer_call(signature, codes, sys._getframe(1), args, kwargs)
        if use_trl_config:
            kwargs["use_model_defaults"] = False
        return original(*args, **kwargs)

    return generate


def apply(module, patcher) -> None:
    from transformers.generation.utils import GenerationMixin

    codes = frozenset(unwrap(getattr(module.GRPOTrainer, name)).__code__ for name, _ in _sampling_methods(module.GRPOTrainer))
    patcher.wrap(GenerationMixin, "generate", lambda original: _wrapper(original, codes))
