"""logps-temperature: TRL < 0.16 samples at ``temperature`` but computes log-probs at temperature 1.

OPT-IN: this patch changes the training objective, so it is off unless
``TRL_COMPAT_LOGPS_TEMPERATURE=1`` is set before ``import trl`` (``Patch.opt_in``). Off, where the
probe finds the bug, it reports "disabled" with a reason that names the switch, and logs that
once at INFO.

Main-branch builds: 0.16.0.dev0 builds from before PR #3029, main commit 04f659737, 2025-03-12 have the bug too.

The bug (PR #3029, "Fix temperature inconsistency in GRPO trainer"): completions are sampled at
``GRPOConfig.temperature`` (default 0.9; ``GenerationConfig`` and vLLM's ``SamplingParams``), while
the policy and reference log-probs, the importance ratio and the KL are computed from the raw
logits, i.e. at temperature 1: the policy-gradient estimate is biased ("potentially causing highly
biased policy gradients"). Silent. TRL 0.16.0 divides the logits by ``self.temperature`` in
``_get_per_token_logps``.

Where it shows: TRL 0.14.0 (the function nested in ``compute_loss``), 0.15.0 - 0.15.2
(``GRPOTrainer._get_per_token_logps``), and the main-branch builds before 04f659737.

Probe: TRL's log-prob function (see ``trl_compat._helpers.logps_calls``), comments dropped, never mentions
``temperature``. Then the switch decides (in the engine): on, "applied"; off, "disabled".

Fix (switched on): while TRL's log-prob function runs (``_get_per_token_logps`` wrapped in 0.15;
``compute_loss`` in 0.14.0), a forward hook on the module TRL calls divides the ``logits`` of the
calls made from that function by ``args.temperature``, after the module's other hooks, as TRL
0.16 does right after the forward. Nothing is done at temperature 1 (or a non-positive one), and
``generate``'s forwards are never touched.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.15.x is no longer supported (the registry's ``remove_when``; a test holds the two
equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed
from trl_compat._helpers import logps_calls

PATCH_ID = "logps-temperature"
SWITCH = "TRL_COMPAT_LOGPS_TEMPERATURE"


def probe(module):
    caller, verdict = logps_calls.unfixed(module.GRPOTrainer, "temperature", "divides the logits by the sampling temperature")
    if verdict is not None:
        return verdict
    return needed(
        f"{caller.where} computes log-probs at temperature 1 while completions are sampled at "
        "GRPOConfig.temperature (default 0.9); the patch divides the logits of TRL's log-prob "
        "forwards by it, as TRL 0.16 does (this changes the training objective)"
    )


def _temperature(trainer):
    value = getattr(getattr(trainer, "args", None), "temperature", None)
    if not isinstance(value, (int, float)) or value <= 0 or value == 1:
        return None
    return float(value)


def _post_hook(temperature, raw):
    def divide(module, args, kwargs, output):
        logits = getattr(output, "logits", None)
        if logits is None or not logps_calls.called_from(raw):
            return None
        # In place on the ModelOutput TRL receives (attribute and key stay in step).
        output.logits = logits / temperature
        return None

    return divide


def _wrapper(original, raw, models_of):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(self, *args, **kwargs):
        temperature = _temperature(self)
        if temperature is None:
            return original(self, *args, **kwargs)
        try:
            model = signature.bind_partial(self, *args, **kwargs).arguments.get("model")
        except TypeError:
            model = None
        with logps_calls.hooked(models_of(self, model), post=_post_hook(temperature, raw)):
            return original(self, *args, **kwargs)

    return wrapper


def apply(module, patcher) -> None:
    caller = logps_calls.find(module.GRPOTrainer)
    if caller is None:  # the probe found one: only a class changed since could get here
        raise RuntimeError("GRPOTrainer no longer has the log-prob function the probe found")
    if caller.kind == logps_calls.METHOD:
        models_of = lambda self, model: [model]  # noqa: E731
    else:  # nested in compute_loss, which also calls self.ref_model
        models_of = lambda self, model: [model, getattr(self, "ref_model", None)]  # noqa: E731
    patcher.wrap(module.GRPOTrainer, caller.name, lambda original: _wrapper(original, caller.raw, models_of))
