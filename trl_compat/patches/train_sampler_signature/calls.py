"""How the installed code calls GRPOTrainer's sampler methods, and whether their signatures take
that call: read from the dataloader methods GRPOTrainer really uses (its own or transformers')
and, where those hand the method over as ``sampler_fn=``, from ``Trainer._get_dataloader``."""

from __future__ import annotations

import inspect
import re

from trl_compat._helpers.source import code, defining_class

# (sampler method, the dataloader method that calls it, the name upstream gives the dataset)
SAMPLERS = (
    ("_get_train_sampler", "get_train_dataloader", "dataset"),
    ("_get_eval_sampler", "get_eval_dataloader", "eval_dataset"),
)


def _flat(function) -> str:
    """Its code without comments, docstrings or any spaces: one string for the regexes below."""
    return "".join(code(function).split())


def _positional_passed(cls, sampler: str, loader: str):
    """How many positional arguments the installed code passes to ``sampler``
    (None: cannot tell) and where that was read."""
    owner = defining_class(cls, loader)
    if owner is None:
        return None, f"no {loader} found on {cls.__name__}"
    where = f"{owner.__module__}.{owner.__qualname__}.{loader}"
    text = _flat(vars(owner)[loader])
    if f"self.{sampler}()" in text:
        return 0, where
    if f"sampler_fn=self.{sampler}" in text:
        dataloader = getattr(cls, "_get_dataloader", None)
        if dataloader is None:
            return None, f"{where} hands {sampler} to _get_dataloader, which does not exist"
        calls = set(re.findall(r"sampler_fn\(([^()]*)\)", _flat(dataloader)))
        if len(calls) != 1:
            return None, f"{where} hands {sampler} to _get_dataloader, whose calls of it are {sorted(calls)}"
        args = [a for a in next(iter(calls)).split(",") if a]
        if any("=" in a or a.startswith("*") for a in args):
            return None, f"_get_dataloader calls sampler_fn({','.join(args)}), with keywords or unpacking"
        return len(args), f"{where} -> Trainer._get_dataloader: sampler_fn({', '.join(args)})"
    found = re.findall(rf"self\.{re.escape(sampler)}\(([^()]*)\)", text)
    if len(set(found)) == 1 and "=" not in found[0] and "*" not in found[0]:
        return len([a for a in found[0].split(",") if a]), where
    return None, f"{where} does not call self.{sampler} in a form trl_compat knows"


def _takes(function, count: int) -> bool:
    try:
        inspect.signature(function).bind(None, *([None] * count))
    except TypeError:
        return False
    return True


def findings(module):
    """``[(sampler, passed, takes_it, where)]`` for each sampler GRPOTrainer has:
    ``passed`` is how many positional arguments the installed code passes (None:
    cannot tell). Raises SourceUnavailable on unreadable code."""
    cls = module.GRPOTrainer
    found = []
    for sampler, loader, _ in SAMPLERS:
        method = getattr(cls, sampler, None)
        if method is None:
            continue
        passed, where = _positional_passed(cls, sampler, loader)
        found.append((sampler, passed, passed is None or _takes(method, passed), where))
    return found


def signature_text(cls, sampler) -> str:
    """``Owner._get_train_sampler(self, ...)``, for reasons."""
    owner = defining_class(cls, sampler)
    signature = inspect.signature(getattr(cls, sampler))
    return f"{(owner or cls).__qualname__}.{sampler}{signature.replace(return_annotation=inspect.Signature.empty)}"
