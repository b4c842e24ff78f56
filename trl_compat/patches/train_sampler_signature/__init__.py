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

Where it shows: trl >=0.15.0.dev0,<=0.17.0.dev0 (main installs before PR #3283)
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

Main-branch builds: 0.17.0.dev0 installs older than PR #3283 have the bug too.

Parts: ``calls`` (how the installed code calls the samplers), ``sampler`` (the wrapper).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.17.0 (and 0.17.0.dev0 installs older than PR
#3283) (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat.patches.train_sampler_signature.calls import SAMPLERS, findings, signature_text
from trl_compat.patches.train_sampler_signature.sampler import wrap


def probe(module):
    cls = module.GRPOTrainer
    found = findings(module)
    broken = [
        f"{where} passes {passed} positional argument(s), which {signature_text(cls, s)} cannot take"
        for s, passed, takes, where in found
        if not takes
    ]
    if broken:
        return needed("; ".join(broken) + ": train() raises TypeError; the dataset argument is taken off")
    unknown = [f"{s}: {where}" for s, passed, _, where in found if passed is None]
    if unknown:
        return undecided("cannot tell how the installed code calls " + "; ".join(unknown))
    ok = [f"{where} passes {passed} positional argument(s), which {signature_text(cls, s)} takes" for s, passed, _, where in found]
    return not_needed("; ".join(ok) or "GRPOTrainer has neither sampler method")


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
        patcher.wrap(cls, sampler, functools.partial(wrap, dataset_names=tuple(names)))
        changed.append(sampler)
    if not changed:  # the probe said otherwise a moment ago
        raise RuntimeError("no sampler method needs wrapping")
