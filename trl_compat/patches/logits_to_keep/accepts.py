"""What the model accepts: the names its ``forward`` takes (from its real signature, and
transformers' ``deprecate_kwarg`` aliases), and the action that follows for what TRL passes."""

from __future__ import annotations

import inspect
import weakref
from typing import NamedTuple

from trl_compat.patches.logits_to_keep.trl_call import NAMES, TrlCall

# Per-model actions (what prepare_model() did); reported by decisions().
MATCH = "names match: forward untouched"
RENAME = "passed under the name the model takes"
SLICE = "logits cut to the requested last positions after the forward"
TRL_SLICES = "takes neither name; TRL slices itself: forward untouched"
UNKNOWN = "signature unreadable: forward untouched"


class Accepts(NamedTuple):
    names: frozenset[str]  # which of NAMES the forward takes (incl. deprecate_kwarg aliases)
    var_kw: bool  # whether it has **kwargs (swallows what it does not know)


def _aliases(fn) -> dict[str, str]:
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


_accepts_cache: weakref.WeakKeyDictionary[type, Accepts | None] = weakref.WeakKeyDictionary()


def accepts(model_cls: type) -> Accepts | None:
    """What ``model_cls.forward`` takes, from its real signature; None if unreadable."""
    try:
        return _accepts_cache[model_cls]
    except (KeyError, TypeError):
        pass
    result = None
    forward = getattr(model_cls, "forward", None)
    try:
        # follows __wrapped__ (4.49-4.51 shim); no forward (None) raises TypeError, handled below
        params = inspect.signature(forward).parameters  # type: ignore[arg-type]
    except (TypeError, ValueError):
        params = None
    if params is not None:
        named = {p for p, v in params.items() if p in NAMES and v.kind in (v.POSITIONAL_OR_KEYWORD, v.KEYWORD_ONLY)}
        for old, new in _aliases(forward).items():
            if old in NAMES and new in named:
                named.add(old)
        result = Accepts(frozenset(named), any(v.kind == v.VAR_KEYWORD for v in params.values()))
    try:
        _accepts_cache[model_cls] = result
    except TypeError:
        pass
    return result


def decide(accepted: Accepts | None, trl: TrlCall) -> str:
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


# The class whose forward stands for "transformers' causal LMs" before any model is known.
REFERENCE_MODEL = "LlamaForCausalLM"


def reference_accepts() -> tuple[Accepts | None, str]:
    """What transformers' causal LMs take (REFERENCE_MODEL's), and which transformers that is."""
    try:
        import transformers
        from transformers.models.llama.modeling_llama import LlamaForCausalLM
    except Exception as exc:  # noqa: BLE001
        return None, f"cannot import transformers' LlamaForCausalLM ({type(exc).__name__}: {exc})"
    return accepts(LlamaForCausalLM), f"transformers {getattr(transformers, '__version__', '?')}"
