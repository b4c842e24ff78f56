"""ref-model-like-policy: with beta > 0, the reference model is built in the policy's dtype and attention
implementation, as TRL 1.16.0.

The bug (fixed in TRL 1.16.0; a change between the 1.15.0 and 1.16.0 wheels, ledger record
``1.15.0..1.16.0:trl/trainer/grpo_trainer.py#3``): when ``beta != 0`` and the model is not a PEFT
model, ``GRPOTrainer.__init__`` does not copy the policy for its reference but loads the checkpoint
again: ``self.ref_model = create_model_from_path(get_config_model_id(self.model.config),
**model_init_kwargs)``, with ``model_init_kwargs`` the config's (``args.model_init_kwargs``, which a
model passed as an instance was never loaded with). So a policy passed in bf16 (or with
``attn_implementation="flash_attention_2"``/``"eager"``) gets a reference in ``create_model_from_path``'s
default dtype (``"float32"`` from TRL 0.27.0, PR #4778; ``"auto"``, the checkpoint's, in 0.26.x) and
transformers' default attention. No error: the reference log-probs come from other weights (fp32
where the policy's are rounded to bf16) and another kernel, so the KL term is not zero at the first
step, when the policy still is the reference, and pulls the policy towards the unrounded weights
all run long (e.g. a tiny bf16 Qwen2, eager attention: KL 8.7e-05 at step 1 instead of 0). Under
DeepSpeed ZeRO-3 with ``bf16`` in the DeepSpeed config, ``zero.Init`` creates the reference's
parameters in bf16 anyway: there only the attention implementation differs. TRL 1.16.0 adds
``model_init_kwargs.setdefault("dtype", self.model.dtype)`` and
``model_init_kwargs.setdefault("attn_implementation", self.model.config._attn_implementation)``
before that call.

History: TRL 0.14 - 0.18 rebuilt the reference from the checkpoint under ZeRO-3 (and FSDP) only and
copied the policy otherwise; PR #3575 (e63588a56, 0.19.0) rebuilt it for every non-PEFT run, with
``AutoModelForCausalLM.from_pretrained`` (0.19) and the checkpoint's own architecture class (0.20 -
0.25, PR #3072); PR #4577 (2af35fb0d, 0.26.0) moved it to ``create_model_from_path``, the module-level
function this patch wraps. Those earlier releases have the bug without a call trl_compat can
correct from outside (a class looked up in ``transformers`` by name inside ``__init__``): not
patched there.

Probe (``GRPOTrainer.__init__``, read with ``_helpers.source.code``): 1.16.0's
``model_init_kwargs.setdefault("dtype", self.model.dtype)``: "not needed". The line above that builds
the reference, with the module's ``create_model_from_path`` and ``get_config_model_id`` present:
"needed". A reference built with ``from_pretrained`` (main-branch 0.26.0.dev0 builds before PR
#4577), or in any other form: "undecided".

Fix: two wrappers. ``GRPOTrainer.__init__`` (through ``_helpers.trainer_init``) notes, per thread,
which trainer is being initialised, and forgets it when TRL's ``__init__`` returns. The module's
``create_model_from_path``, called for that trainer once it holds its policy (``self.model``, set by
``Trainer.__init__``: the policy's own load from a path comes before) with the policy's model id,
is the reference's load: its keyword arguments get 1.16.0's two defaults, the policy's ``dtype``
(none where the caller passed ``torch_dtype``) and ``config._attn_implementation``. What the user
set in ``model_init_kwargs`` stands, as in 1.16.0. Every other call passes through untouched.

Run time: load-bearing: errors propagate. The wrappers only note the trainer and add two keyword
arguments; falling back to TRL's own call on an error would be the bug, unnoticed
(``trl_compat._engine.guarded``). An ``__init__`` that raises leaves its trainer noted until the next
``GRPOTrainer`` is built on that thread: only a direct call of ``trl.trainer.grpo_trainer.
create_model_from_path`` with that failed trainer's model id could meet it.

Delete when: trl_compat no longer supports TRL 0.26.0 - 1.15.x (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import inspect
import threading
import weakref

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

PATCH_ID = "ref-model-like-policy"
LOADER = "create_model_from_path"

_FIXED = 'model_init_kwargs.setdefault("dtype", self.model.dtype)'
_BUGGY = "self.ref_model = create_model_from_path(get_config_model_id(self.model.config), **model_init_kwargs)"
_OLD_FORMS = ("self.ref_model = architecture.from_pretrained(", "self.ref_model = AutoModelForCausalLM.from_pretrained(")

_building = threading.local()  # .trainer: a weak reference to the GRPOTrainer whose __init__ runs on this thread


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if _FIXED in source:
        return not_needed("GRPOTrainer.__init__ builds the reference model in the policy's dtype and attention (fixed code)")
    if _BUGGY in source:
        if not callable(getattr(module, LOADER, None)) or not callable(getattr(module, "get_config_model_id", None)):
            return undecided(f"GRPOTrainer.__init__ calls {LOADER}, which its module does not hold")
        return needed(
            f"with beta != 0 the reference model is loaded again by {LOADER} with the config's model_init_kwargs "
            "only: a policy passed in bf16 (or with its own attn_implementation) gets a float32 (default-attention) "
            "reference, and the KL term is not zero at the first step"
        )
    if any(form in source for form in _OLD_FORMS):
        return undecided(
            "GRPOTrainer.__init__ loads the reference model with from_pretrained (TRL < 0.26): its dtype is not "
            "the policy's and trl_compat does not correct it here; TRL 1.16.0 builds it like the policy"
        )
    return undecided("GRPOTrainer.__init__ builds the reference model in a form trl_compat does not know")


def _begin(trainer, arguments) -> None:
    _building.trainer = weakref.ref(trainer)


def _end(trainer, arguments) -> None:
    _building.trainer = None


def _policy():
    """The policy of the trainer being initialised on this thread, once ``Trainer.__init__`` has set it."""
    ref = getattr(_building, "trainer", None)
    trainer = ref() if ref is not None else None
    return vars(trainer).get("model") if trainer is not None else None


def _defaults(policy) -> dict:
    """1.16.0's two defaults: the policy's dtype and attention implementation."""
    defaults = {"dtype": policy.dtype}
    attention = getattr(policy.config, "_attn_implementation", None)
    if attention is not None:
        defaults["attn_implementation"] = attention
    return defaults


def _wrap_loader(module):
    def factory(original):
        signature = inspect.signature(original)
        model_id_name = next(iter(signature.parameters))

        @functools.wraps(original)
        def create_model_from_path(*args, **kwargs):
            policy = _policy()
            if policy is None or not hasattr(policy, "config"):
                return original(*args, **kwargs)
            try:
                model_id = signature.bind_partial(*args, **kwargs).arguments.get(model_id_name)
            except TypeError:
                return original(*args, **kwargs)  # TRL reports a bad call as it always did
            if model_id is None or model_id != module.get_config_model_id(policy.config):
                return original(*args, **kwargs)
            for name, value in _defaults(policy).items():
                if name == "dtype" and "torch_dtype" in kwargs:
                    continue  # the caller's own dtype, under transformers' older name
                kwargs.setdefault(name, value)
            return original(*args, **kwargs)

        return create_model_from_path

    return factory


def apply(module, patcher) -> None:
    around_init(before=_begin, after=_end)(module, patcher)
    patcher.wrap(module, LOADER, _wrap_loader(module))
