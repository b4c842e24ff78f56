"""train-sampler-signature: GRPOTrainer's sampler overrides take the dataset transformers >= 4.52 passes.

The bug
    transformers PR #38090 (4.52) builds every dataloader through
    ``Trainer._get_dataloader(..., sampler_fn=self._get_train_sampler)``, which
    calls ``sampler_fn(dataset)``; the base method became
    ``_get_train_sampler(self, train_dataset=None)`` (PR #38226). TRL 0.15.x
    and 0.16.x override it as ``GRPOTrainer._get_train_sampler(self)`` (TRL PR
    #2776), so ``trainer.train()`` dies before the first step with
    ``TypeError: GRPOTrainer._get_train_sampler() takes 1 positional argument
    but 2 were given``. Users pinned to TRL 0.15/0.16 cannot take any
    transformers update from 4.52 on. TRL 0.17.0 (PR #3283) overrides
    ``get_train_dataloader`` and calls the sampler without an argument; TRL
    0.18.0 (PR #3488, 7f32792c0) gives it ``dataset: Optional[Dataset] = None``
    and builds the sampler on that dataset. ``_get_eval_sampler(self,
    eval_dataset)`` always took the dataset and is not affected.

Affected: trl >=0.15.0.dev0,<=0.17.0.dev0 (main installs before PR #3283)
with transformers >= 4.52.

How the probe recognises it
    It reads how the installed code calls each sampler: the source of the
    ``get_train_dataloader``/``get_eval_dataloader`` that GRPOTrainer really
    uses (its own or transformers'), and, where that hands the method over as
    ``sampler_fn=``, the source of ``Trainer._get_dataloader``
    (``sampler_fn(dataset)``: one positional argument). It then binds that many
    arguments to the real signature of ``GRPOTrainer._get_train_sampler`` (and
    ``_get_eval_sampler``). A call the signature cannot take is the bug; a call
    form it does not recognise gives "undecided".

The fix
    Each sampler method whose signature cannot take the call is wrapped. A call
    the original accepts is passed through untouched; the one extra dataset
    argument is taken off, TRL's method builds its ``RepeatRandomSampler``
    (grouped, repeated indices unchanged), and, as TRL 0.18 does, the sampler
    is pointed at the dataset it was given (transformers passes the
    column-pruned copy of ``train_dataset``: same rows). Any other call reaches
    TRL's method as it is.

Remove this patch when trl_compat no longer supports TRL < 0.17.0 (and
0.17.0.dev0 installs older than PR #3283).
"""

from __future__ import annotations

import functools
import inspect
import logging
import re

from trl_compat._engine import Patch, affected, needed, not_needed, undecided
from trl_compat._source import code, defining_class

log = logging.getLogger("trl_compat")

PATCH_ID = "train-sampler-signature"

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


def _signature_text(cls, sampler) -> str:
    owner = defining_class(cls, sampler)
    signature = inspect.signature(getattr(cls, sampler))
    return f"{owner.__qualname__}.{sampler}{signature.replace(return_annotation=inspect.Signature.empty)}"


def probe(module):
    cls = module.GRPOTrainer
    found = findings(module)
    broken = [f"{where} passes {passed} positional argument(s), which {_signature_text(cls, s)} cannot take"
              for s, passed, takes, where in found if not takes]
    if broken:
        return needed("; ".join(broken) + ": train() raises TypeError; the dataset argument is taken off")
    unknown = [f"{s}: {where}" for s, passed, _, where in found if passed is None]
    if unknown:
        return undecided("cannot tell how the installed code calls " + "; ".join(unknown))
    ok = [f"{where} passes {passed} positional argument(s), which {_signature_text(cls, s)} takes"
          for s, passed, _, where in found]
    return not_needed("; ".join(ok) or "GRPOTrainer has neither sampler method")


def _retarget(sampler, dataset):
    """Build the sampler on the dataset transformers passed, as TRL 0.18 does."""
    if dataset is None or not hasattr(sampler, "data_source") or not hasattr(sampler, "num_samples"):
        return sampler
    try:
        size = len(dataset)
    except TypeError:
        return sampler
    if sampler.data_source is dataset:
        return sampler
    sampler.data_source, sampler.num_samples = dataset, size
    return sampler


def _wrap(original, dataset_names):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def sampler(self, *args, **kwargs):
        try:
            signature.bind(self, *args, **kwargs)
        except TypeError:
            pass
        else:
            return original(self, *args, **kwargs)
        if len(args) == 1 and not kwargs:
            dataset = args[0]
        elif not args and len(kwargs) == 1 and next(iter(kwargs)) in dataset_names:
            dataset = next(iter(kwargs.values()))
        else:  # not the call this patch knows: TRL's own behaviour (and error)
            return original(self, *args, **kwargs)
        try:
            signature.bind(self)
        except TypeError:
            return original(self, *args, **kwargs)
        result = original(self)
        try:
            return _retarget(result, dataset)
        except Exception:  # noqa: BLE001 - never break training over the retarget
            log.debug("trl_compat: %s: could not point the sampler at the given dataset", PATCH_ID, exc_info=True)
            return result

    # inspect.signature() shows what the wrapper takes, not the original's (self).
    extra = inspect.Parameter(dataset_names[0], inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    sampler.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])
    return sampler


def apply(module, patcher) -> None:
    from transformers import Trainer  # already imported by TRL

    cls = module.GRPOTrainer
    upstream_names = {sampler: name for sampler, _, name in SAMPLERS}
    changed = []
    for sampler, _, takes, _ in findings(module):
        if takes:
            continue
        names = [upstream_names[sampler]]
        try:  # transformers' own name for it (train_dataset / eval_dataset)
            names += [p for p in list(inspect.signature(getattr(Trainer, sampler)).parameters)[1:2] if p not in names]
        except (TypeError, ValueError, AttributeError):
            pass
        patcher.wrap(cls, sampler, functools.partial(_wrap, dataset_names=tuple(names)))
        changed.append(sampler)
    if not changed:  # the probe said otherwise a moment ago
        raise RuntimeError("no sampler method needs wrapping")


# The versions named above, inside the window (the probe decides) or outside it: tests/test_windows.py.
VERSIONS = {"trl": {"inside": ["0.15.0", "0.16.1", "0.17.0.dev0"], "outside": ["0.14.0", "0.17.0", "0.18.0"]},
            "transformers": {"inside": ["4.52.0"], "outside": ["4.51.3"]}}

PATCH = Patch(
    id=PATCH_ID,
    summary="GRPOTrainer._get_train_sampler accepts the dataset transformers >= 4.52 passes (train() no longer "
            "dies with TypeError); the grouped RepeatRandomSampler is unchanged",
    upstream=(
        "transformers PR #38090 (4.52: sampler_fn(dataset)) and #38226; "
        "fixed in TRL by PR #3283 (0.17.0, own get_train_dataloader) and PR #3488 (0.18.0, dataset argument)"
    ),
    module="trl.trainer.grpo_trainer",
    target="GRPOTrainer",  # the override it wraps is inherited from Trainer once removed: the class is what must exist
    requires={"trl": affected("0.15.0", "0.17.0"), "transformers": affected("4.52.0")},
    probe=probe,
    apply=apply,
    remove_when="trl_compat no longer supports TRL < 0.17.0 (and 0.17.0.dev0 installs older than PR #3283)",
)
