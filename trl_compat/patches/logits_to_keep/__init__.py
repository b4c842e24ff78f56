"""logits-to-keep: TRL's "compute only the last K+1 logits" request must reach the model.

The bug
    GRPO needs logits for the completion tokens only, so TRL asks the model for
    the last ``K+1`` positions. TRL and transformers renamed that argument at
    different times, and the model's forward takes either name, or neither:

    * TRL 0.14.0 passes ``num_logits_to_keep=K+1`` (PR #2683) and has no
      fallback slice: it takes log-probs from the *first* K rows it gets back.
      transformers 4.52 removed ``num_logits_to_keep`` and swallows it in
      ``**kwargs``, so on transformers >= 4.52 the log-probs come from the
      prompt positions: training is silently wrong. The same happens on any
      transformers with a model that takes neither name but has ``**kwargs``
      (e.g. BloomForCausalLM on 4.46.3); a model with neither name and no
      ``**kwargs`` (GPT-2, OPT, Falcon on 4.46.3) raises TypeError.
    * TRL 0.15.0 to 0.18.x pass ``logits_to_keep=K+1`` (PR #2721) and slice
      the result themselves (PR #2773, issue #2770). On transformers <= 4.48,
      Qwen2/Llama/... only know ``num_logits_to_keep`` and swallow the new
      name: the full ``[B, L, V]`` logits are computed, which is right but can
      be the difference between fitting and OOM for a 151,936-token
      vocabulary. Forwards without ``**kwargs`` (GPT-2, OPT, Mistral on
      4.46.3) raise ``TypeError: ... got an unexpected keyword argument
      'logits_to_keep'``.
    * TRL 0.19.x removed the fallback slice (PR #3553): a model whose forward
      takes neither name but has ``**kwargs`` (OPT up to 4.53, GPT-2 on
      4.51-4.52, TrOCR on 5.x) gives a shape
      RuntimeError in fp32 and silently misaligned log-probs in bf16.
    * transformers 4.49 to 4.51 accept both names (``@deprecate_kwarg``).

    Upstream: https://github.com/huggingface/trl/issues/2770, PRs #2683,
    #2721, #2773, #3553; transformers PR #37149 (shim removed in 4.52).

How the probe recognises it (nothing is decided from version numbers)
    *TRL side*, from the source of the code that calls the model
    (``GRPOTrainer._get_per_token_logps`` in 0.15+, the function nested in
    ``GRPOTrainer.compute_loss`` in 0.14.0 and in 0.15.0.dev0 builds before
    PR #2762), comments removed: which name it passes
    (``logits_to_keep=logits_to_keep + 1`` or
    ``num_logits_to_keep=num_logits_to_keep + 1``) and whether it slices the
    logits itself (``logits = logits[:, -logits_to_keep:]``).
    *transformers side*, from the signature of ``LlamaForCausalLM.forward``
    (``inspect.signature`` follows ``__wrapped__``; the 4.49-4.51 shim is read
    from ``deprecate_kwarg``'s closure): which names the causal LMs take.
    Needed when TRL passes a name they do not take, or when TRL has no
    fallback slice (then every model lacking the name gets wrong values or a
    TypeError). Not needed when TRL passes a name they take and slices itself.

The fix
    TRL's way in to the policy and the reference model is wrapped:
    ``GRPOTrainer._get_per_token_logps(model, ...)`` in 0.15-0.19, which
    calls them. In 0.14.0 the function that calls them is nested in
    ``compute_loss`` (and ``compute_loss`` is wrapped by vllm-lora-names), so
    ``GRPOTrainer._prepare_inputs`` is wrapped instead: transformers'
    ``training_step`` and ``prediction_step`` call it right before
    ``compute_loss``, and it prepares ``self.model``, ``self.model_wrapped``
    and ``self.ref_model``. Before TRL calls a model, the wrapper finds its
    innermost model (through PEFT, DDP, DeepSpeed, FSDP and torch.compile)
    and decides from the real signature of its class's ``forward``:

    * it takes the name TRL passes: nothing is done (forward untouched);
    * it takes the other name: the request is passed under that name;
    * it takes neither: the logits are cut to the requested last K+1
      positions after the forward (and the kwarg is dropped if the forward has no
      ``**kwargs``). If TRL slices itself and the forward has ``**kwargs``,
      nothing is done: values are already right and the model cannot compute
      fewer logits anyway.

    The change is made on the innermost model *instance's* ``forward``
    (``forward.py`` says why not a hook); ``trl_compat.revert()`` restores it.

Parts: ``trl_call`` (what TRL asks for), ``accepts`` (what the model takes, and the action),
``forward`` (the per-instance wrapper and its undo), ``prepare`` (TRL's entry point).

Delete when: trl_compat drops TRL < 0.20, or requires transformers >= 4.49 for TRL 0.15-0.18 and no
longer supports TRL 0.14.0/0.19.x with models whose forward lacks logits_to_keep (the registry's
``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat.patches.logits_to_keep.accepts import REFERENCE_MODEL, reference_accepts
from trl_compat.patches.logits_to_keep.forward import SWITCH
from trl_compat.patches.logits_to_keep.prepare import decisions, wrap_entry
from trl_compat.patches.logits_to_keep.trl_call import NEXT, read_trl


def probe(module):
    if NEXT in vars(module.GRPOTrainer):
        return not_needed(
            f"GRPOTrainer calls the models from {NEXT} (TRL 0.20's code, on main from PR #3563), "
            "which needs a transformers whose causal LMs take logits_to_keep"
        )
    trl, why = read_trl(module)
    if trl is None:
        return undecided(why)
    ref, tf = reference_accepts()
    if ref is None:
        return undecided(tf)
    takes = " and ".join(sorted(ref.names)) or "neither name"
    where = f"GRPOTrainer.{trl.caller}"
    if trl.passed not in ref.names:
        return needed(
            f"{where} passes {trl.passed}=K+1 but {tf}'s causal LMs take {takes} (as read from {REFERENCE_MODEL}; "
            "each model TRL calls is decided from its own class's forward): "
            + (
                "full [B, L, V] logits are computed (TRL slices afterwards)"
                if trl.fallback
                else "full logits come back and TRL, which has no fallback slice, takes log-probs from the wrong positions"
            )
            + "; the request is passed under the model's own name, decided per model"
        )
    if not trl.fallback:
        return needed(
            f"{where} passes {trl.passed}=K+1 and has no fallback slice: a model whose forward lacks {trl.passed} "
            "gives wrong log-probs or a TypeError; decided per model (models that take it are left untouched)"
        )
    return not_needed(f"{where} passes {trl.passed}=K+1, which {tf}'s causal LMs take, and slices the logits itself")


def report_details() -> str:
    """The model classes decided for in this process, for the report (the probe only read
    transformers' reference class)."""
    decided = decisions()
    if not decided:
        return ""
    return "models decided: " + ", ".join(f"{cls.rpartition('.')[2]}: {action}" for cls, action in sorted(decided.items()))


def apply(module, patcher) -> None:
    trl, why = read_trl(module)
    if trl is None:  # the probe read it a moment ago
        raise RuntimeError(why)
    SWITCH.active = trl
    patcher.on_undo(lambda: delattr(SWITCH, "active"))  # also restores every model's forward
    patcher.wrap(module.GRPOTrainer, trl.entry, functools.partial(wrap_entry, trl=trl))
