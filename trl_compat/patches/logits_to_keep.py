"""logits-to-keep: TRL's "compute only the last K+1 logits" request must reach the model.

Remove this patch when trl_compat no longer supports TRL < 0.20 with
transformers < 4.49 (or >= 4.52 for TRL 0.14.0), nor TRL 0.14.0/0.19.x with
models whose forward lacks ``logits_to_keep``.

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

    The change is made on the innermost model *instance's* ``forward`` (a
    method bound to that instance, so ``copy.deepcopy`` rebinds it), not with
    a forward pre-hook: PEFT's ``BaseTuner.forward`` (peft <= 0.17) calls
    ``self.model.forward(...)`` directly, which bypasses module hooks. It is
    idempotent, keeps ``inspect.signature(model.forward)`` unchanged, and
    ``trl_compat.revert()`` restores the original ``forward`` of every model
    it changed (a wrapper that something else has wrapped again meanwhile is
    switched to pass-through instead).

"""

from __future__ import annotations

import functools
import inspect
import logging
import numbers
import re
import threading
import types
import weakref
from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from trl_compat._models import peel
from trl_compat._engine import Patch, affected, needed, not_needed, undecided
from trl_compat._source import code

log = logging.getLogger("trl_compat")

PATCH_ID = "logits-to-keep"
NEW = "logits_to_keep"  # transformers >= 4.49
OLD = "num_logits_to_keep"  # transformers <= 4.51
NEXT = "_get_per_token_logps_and_entropies"  # TRL 0.20's entry point (PR #3563, 7e8ef867a)
NAMES = (NEW, OLD)

# Per-model actions (what prepare_model() did); reported by decisions().
MATCH = "names match: forward untouched"
RENAME = "passed under the name the model takes"
SLICE = "logits cut to the requested last positions after the forward"
TRL_SLICES = "takes neither name; TRL slices itself: forward untouched"
UNKNOWN = "signature unreadable: forward untouched"

_PREV = "_trl_compat_logits_to_keep_prev_forward"  # the forward ours replaced; None = the class's
_MISSING = object()


class TrlCall(NamedTuple):
    """What the installed TRL does, read from its source by the probe."""

    passed: str  # the kwarg name TRL passes to the model
    fallback: bool  # whether TRL slices the logits itself afterwards
    entry: str  # the GRPOTrainer method wrapped to prepare the models before TRL calls them
    caller: str  # the GRPOTrainer method whose code calls the models (its source was read)


# -- reading TRL's source -----------------------------------------------------------------


_PASS_RE = re.compile(r"\b(num_logits_to_keep|logits_to_keep)\s*=\s*(?:num_logits_to_keep|logits_to_keep)\s*\+\s*1\b")
_FALLBACK_RE = re.compile(r"\blogits\s*=\s*logits\s*\[\s*:\s*,\s*-\s*(?:num_logits_to_keep|logits_to_keep)\s*:\s*\]")


def _caller(trainer_cls) -> Tuple[str, Optional[str]]:
    """The method whose code calls the models, and its code."""
    for name, must_contain in (("_get_per_token_logps", None), ("compute_loss", "def get_per_token_logps")):
        fn = getattr(trainer_cls, name, None)
        if fn is None:
            continue
        text = code(fn)  # unwraps decorators and other patches' wrappers
        if must_contain is None or must_contain in text:
            return name, text
    return "", None


def read_trl(module) -> Tuple[Optional[TrlCall], str]:
    """``(TrlCall, "")`` or ``(None, why not)`` for the loaded ``trl.trainer.grpo_trainer``."""
    caller, text = _caller(module.GRPOTrainer)
    if not caller:
        return None, "GRPOTrainer has neither _get_per_token_logps nor a compute_loss with a nested get_per_token_logps"
    passed = set(_PASS_RE.findall(text))
    if len(passed) != 1:
        return None, (f"GRPOTrainer.{caller} passes {sorted(passed) or 'neither logits_to_keep nor num_logits_to_keep'}"
                      " as `<name>=<name> + 1`; expected exactly one")
    # 0.15+: the method that calls the models gets the model as an argument: wrap it. 0.14.0: the
    # caller is a function nested in compute_loss (which vllm-lora-names wraps too); wrap
    # _prepare_inputs instead, which transformers' training_step and prediction_step (and
    # grpo-eval-0.14's) call right before compute_loss, and prepare the trainer's models there.
    entry = caller if caller == "_get_per_token_logps" else "_prepare_inputs"
    return TrlCall(passed.pop(), bool(_FALLBACK_RE.search(text)), entry, caller), ""


# -- reading the model side ---------------------------------------------------------------


class Accepts(NamedTuple):
    names: FrozenSet[str]  # which of NAMES the forward takes (incl. deprecate_kwarg aliases)
    var_kw: bool  # whether it has **kwargs (swallows what it does not know)


def _aliases(fn) -> Dict[str, str]:
    """``old -> new`` renames done by transformers' ``deprecate_kwarg`` wrappers around ``fn``."""
    found = {}
    for _ in range(20):
        if fn is None:
            break
        code = getattr(fn, "__code__", None)
        closure = getattr(fn, "__closure__", None)
        if code is not None and closure:
            cells = {}
            for var, cell in zip(code.co_freevars, closure):
                try:
                    cells[var] = cell.cell_contents
                except ValueError:  # empty cell
                    continue
            old, new = cells.get("old_name"), cells.get("new_name")
            if isinstance(old, str) and isinstance(new, str):
                found[old] = new
        fn = getattr(fn, "__wrapped__", None)
    return found


_accepts_cache: "weakref.WeakKeyDictionary[type, Optional[Accepts]]" = weakref.WeakKeyDictionary()


def accepts(model_cls: type) -> Optional[Accepts]:
    """What ``model_cls.forward`` takes, from its real signature; None if unreadable."""
    try:
        return _accepts_cache[model_cls]
    except (KeyError, TypeError):
        pass
    result = None
    forward = getattr(model_cls, "forward", None)
    try:
        params = inspect.signature(forward).parameters  # follows __wrapped__ (4.49-4.51 shim)
    except (TypeError, ValueError):
        params = None
    if params is not None:
        named = {p for p, v in params.items()
                 if p in NAMES and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)}
        for old, new in _aliases(forward).items():
            if old in NAMES and new in named:
                named.add(old)
        result = Accepts(frozenset(named), any(v.kind == v.VAR_KEYWORD for v in params.values()))
    try:
        _accepts_cache[model_cls] = result
    except TypeError:
        pass
    return result


# -- the per-instance forward ---------------------------------------------------------------


class _Switch:
    """On while the patch is applied. ``active`` holds the TrlCall facts.

    apply() turns it on by setting ``active`` and off (``patcher.on_undo``) by
    deleting that attribute; deleting it also restores the forward of every
    model we changed, so ``revert()`` leaves nothing behind."""

    active: Optional[TrlCall] = None

    def __delattr__(self, name: str) -> None:
        super().__delattr__(name)
        if name == "active":
            unwrap_all()


SWITCH = _Switch()
_lock = threading.RLock()
_wrapped: "weakref.WeakSet[Any]" = weakref.WeakSet()
_decisions: Dict[str, str] = {}


def _keep_last(logits, keep):
    """transformers' own slicing: int k keeps the last k (0 = all); a tensor picks positions."""
    if isinstance(keep, numbers.Integral):
        return logits[:, -int(keep):, :] if keep > 0 else logits
    return logits[:, keep, :]


class _KeepLogitsForward:
    """Bound to one model instance as its ``forward``; see the module docstring.

    Holds no reference to the instance (``copy.deepcopy`` rebinds the method and
    the ``_PREV`` attribute to the copy)."""

    def __init__(self, accepted: Accepts, wrapped, signature: Optional[inspect.Signature]):
        self.accepted = accepted
        self.__wrapped__ = wrapped  # the function underneath, for accelerate's unwrapping
        if signature is not None:
            self.__signature__ = signature  # inspect.signature(model.forward) stays as it was
        self.__name__ = "forward"
        self.__qualname__ = getattr(wrapped, "__qualname__", "forward")
        self.__doc__ = getattr(wrapped, "__doc__", None)
        self.__module__ = getattr(wrapped, "__module__", __name__)
        setattr(self, "__trl_compat_patch__", PATCH_ID)

    def __call__(self, module, *args, **kwargs):
        prev = module.__dict__.get(_PREV, None)
        call = prev if prev is not None else types.MethodType(type(module).forward, module)
        if SWITCH.active is None or not any(name in kwargs for name in NAMES):
            return call(*args, **kwargs)
        names, var_kw = self.accepted
        target = NEW if NEW in names else (OLD if OLD in names else None)
        keep = _MISSING
        for name in NAMES:
            if name not in kwargs or name in names:
                continue
            if target is None:  # takes neither: cut the logits ourselves afterwards
                keep = kwargs[name]
                if not var_kw:  # it would raise TypeError; with **kwargs it may still pass it on and honour it
                    kwargs.pop(name)
                continue
            value = kwargs.pop(name)
            if target in kwargs:
                continue  # the model's own name wins, as with transformers' deprecate_kwarg
            if target == NEW or isinstance(value, numbers.Integral):
                kwargs[target] = value
            else:  # num_logits_to_keep only ever took an int
                keep = value
        out = call(*args, **kwargs)
        if keep is _MISSING:
            return out
        logits = getattr(out, "logits", None)
        if logits is None or getattr(logits, "dim", lambda: 0)() != 3:
            log.warning("trl_compat: %s: %s returned no 3-d `logits`; left as it is",
                        PATCH_ID, type(module).__name__)
            return out
        out.logits = _keep_last(logits, keep)  # ModelOutput keeps attribute and key in step
        return out


def _ours(forward) -> bool:
    """Whether ``forward`` is our wrapper, possibly under other wrappers."""
    for _ in range(32):
        if forward is None:
            return False
        if isinstance(getattr(forward, "__func__", None), _KeepLogitsForward) or isinstance(forward, _KeepLogitsForward):
            return True
        forward = getattr(forward, "__wrapped__", None)
    return False


def _with_self(sig: inspect.Signature) -> inspect.Signature:
    first = inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)
    return sig.replace(parameters=[first, *sig.parameters.values()])


def _wrap(inner, accepted: Accepts) -> None:
    prev = inner.__dict__.get("forward", None)
    underlying = prev.__func__ if isinstance(prev, types.MethodType) else (prev or type(inner).forward)
    try:
        signature = _with_self(inspect.signature(inner.forward))
    except (TypeError, ValueError):
        signature = None
    inner.__dict__[_PREV] = prev
    inner.forward = types.MethodType(_KeepLogitsForward(accepted, underlying, signature), inner)
    _wrapped.add(inner)


def decide(accepted: Optional[Accepts], trl: TrlCall) -> str:
    """The per-model action for a forward that takes ``accepted``."""
    if accepted is None:
        return UNKNOWN
    if trl.passed in accepted.names:
        return MATCH
    if accepted.names:
        return RENAME
    if trl.fallback and accepted.var_kw:
        return TRL_SLICES
    return SLICE


def prepare_model(model: Any) -> Optional[str]:
    """Make TRL's request reach ``model`` (the action taken, or None while the patch is off).

    Called by the patched TRL entry point for every model TRL is about to call;
    idempotent."""
    trl = SWITCH.active
    if trl is None or model is None:
        return None
    inner = peel(model)
    try:
        import torch

        if not isinstance(inner, torch.nn.Module):
            return UNKNOWN
    except ImportError:  # pragma: no cover - TRL needs torch
        return UNKNOWN
    accepted = accepts(type(inner))
    action = decide(accepted, trl)
    with _lock:
        if action in (RENAME, SLICE):
            if _ours(inner.__dict__.get("forward")):
                _wrapped.add(inner)  # e.g. a deepcopy of a wrapped model: revert() restores it too
            else:
                _wrap(inner, accepted)
        key = f"{type(inner).__module__}.{type(inner).__qualname__}"
        if _decisions.get(key) != action:
            _decisions[key] = action
            log.log(logging.WARNING if action == UNKNOWN else logging.INFO,
                    "trl_compat: %s: %s (forward takes %s%s; TRL passes %s): %s", PATCH_ID, type(inner).__name__,
                    sorted(accepted.names) if accepted else "?", ", **kwargs" if accepted and accepted.var_kw else "",
                    trl.passed, action)
    return action


def unwrap(model: Any) -> bool:
    """Restore the innermost model's original ``forward`` if ours is on top; True if restored."""
    inner = peel(model)
    with _lock:
        current = inner.__dict__.get("forward", None)
        if not (isinstance(current, types.MethodType) and isinstance(current.__func__, _KeepLogitsForward)):
            return False  # not ours, or someone wrapped ours again: ours passes through while switched off
        prev = inner.__dict__.pop(_PREV, None)
        if prev is None:
            del inner.forward
        else:
            inner.forward = prev
        _wrapped.discard(inner)
        return True


def unwrap_all() -> None:
    for model in list(_wrapped):
        try:
            unwrap(model)
        except Exception:  # noqa: BLE001 - reverting must go on for the other models
            log.warning("trl_compat: %s: could not restore %s.forward", PATCH_ID, type(model).__name__, exc_info=True)


def wrapped_models() -> List[Any]:
    return list(_wrapped)


def decisions() -> Dict[str, str]:
    """``{model class: action}`` for every model class TRL called while the patch was on."""
    with _lock:
        return dict(_decisions)


# -- probe and apply --------------------------------------------------------------------------


def _reference_accepts() -> Tuple[Optional[Accepts], str]:
    try:
        import transformers
        from transformers.models.llama.modeling_llama import LlamaForCausalLM
    except Exception as exc:  # noqa: BLE001
        return None, f"cannot import transformers' LlamaForCausalLM ({type(exc).__name__}: {exc})"
    return accepts(LlamaForCausalLM), f"transformers {getattr(transformers, '__version__', '?')}"


def probe(module):
    if NEXT in vars(module.GRPOTrainer):
        return not_needed(f"GRPOTrainer calls the models from {NEXT} (TRL 0.20's code, on main from PR #3563), "
                          "which needs a transformers whose causal LMs take logits_to_keep")
    trl, why = read_trl(module)
    if trl is None:
        return undecided(why)
    ref, tf = _reference_accepts()
    if ref is None:
        return undecided(tf)
    takes = " and ".join(sorted(ref.names)) or "neither name"
    where = f"GRPOTrainer.{trl.caller}"
    if trl.passed not in ref.names:
        return needed(
            f"{where} passes {trl.passed}=K+1 but {tf}'s causal LMs (LlamaForCausalLM) take {takes}: "
            + ("full [B, L, V] logits are computed (TRL slices afterwards)" if trl.fallback else
               "full logits come back and TRL, which has no fallback slice, takes log-probs from the wrong positions")
            + "; the request is passed under the model's own name, decided per model")
    if not trl.fallback:
        return needed(
            f"{where} passes {trl.passed}=K+1 and has no fallback slice: a model whose forward lacks {trl.passed} "
            "gives wrong log-probs or a TypeError; decided per model (models that take it are left untouched)")
    return not_needed(f"{where} passes {trl.passed}=K+1, which {tf}'s causal LMs take, and slices the logits itself")


def _wrap_entry(original, trl: TrlCall):
    signature = inspect.signature(original)

    def models_in(self, args, kwargs):
        if trl.entry == "_get_per_token_logps":
            return [signature.bind_partial(self, *args, **kwargs).arguments.get("model")]
        # 0.14.0: compute_loss's nested function gets `model` (model_wrapped in training, the
        # model in evaluation) and `self.ref_model`; all share their innermost model with these.
        return [getattr(self, "model", None), getattr(self, "model_wrapped", None), getattr(self, "ref_model", None)]

    warned = []

    @functools.wraps(original)
    def entry(self, *args, **kwargs):
        if SWITCH.active is not trl:
            # Reverted, but another patch wrapped this method after us, so the engine left us in
            # place: pass straight through.
            return original(self, *args, **kwargs)
        try:
            for model in models_in(self, args, kwargs):
                prepare_model(model)
        except Exception:  # noqa: BLE001 - never break training; TRL's own behaviour follows
            if not warned:
                warned.append(True)
                log.warning("trl_compat: %s: could not prepare the model; TRL runs unchanged", PATCH_ID,
                            exc_info=True)
        return original(self, *args, **kwargs)

    return entry


def apply(module, patcher) -> None:
    trl, why = read_trl(module)
    if trl is None:  # the probe read it a moment ago
        raise RuntimeError(why)
    SWITCH.active = trl
    patcher.on_undo(lambda: delattr(SWITCH, "active"))  # also restores every model's forward
    patcher.wrap(module.GRPOTrainer, trl.entry, functools.partial(_wrap_entry, trl=trl))


# The versions named above, inside the window (the probe decides) or outside it: tests/test_windows.py.
VERSIONS = {"trl": {"inside": ["0.14.0", "0.15.0", "0.18.2", "0.19.0", "0.19.1", "0.20.0.dev0"],
                    "outside": ["0.20.0"]}}

PATCH = Patch(
    id=PATCH_ID,
    summary="pass TRL's logits_to_keep/num_logits_to_keep under the name the model takes, else keep the last K logits",
    upstream=(
        "https://github.com/huggingface/trl/issues/2770 (name mismatch; PR #2773 added a fallback slice in 0.15.0, "
        "PR #3553 removed it in 0.19.0); transformers PR #37149 removed num_logits_to_keep in 4.52"
    ),
    module="trl.trainer.grpo_trainer",
    target="GRPOTrainer",
    # 0.20 renamed the entry point (_get_per_token_logps_and_entropies) and requires transformers>=4.53.2;
    # its 0.20.0.dev0 builds before PR #3563 carry 0.19's code: the probe tells them apart.
    requires={"trl": affected("0.14.0", "0.20.0")},
    probe=probe,
    apply=apply,
    remove_when=(
        "trl_compat drops TRL < 0.20, or requires transformers >= 4.49 for TRL 0.15-0.18 and no longer supports "
        "TRL 0.14.0/0.19.x with models whose forward lacks logits_to_keep"
    ),
)
