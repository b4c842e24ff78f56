"""entropy-mask-gather-hang: with ``top_entropy_quantile < 1`` on 2 or more processes, TRL 0.21.0 -
0.23.0 gathers tensors of a different length on each rank: the run hangs (or gloo raises).

The bug
    ``GRPOTrainer.get_high_entropy_mask`` computes the entropy threshold over all ranks' completion
    tokens. TRL 0.21.0 (PR #3833) does ``self.accelerator.gather(non_pad_entropies)``, whose length
    is this rank's number of completion tokens: it differs between ranks whenever completions stop
    at EOS at different points, and the collective then hangs (NCCL, issue #3933) or fails (gloo:
    ``op.preamble.length <= op.nbytes``). TRL 0.23.0 (PR #3964) gathers the lengths and pads first,
    but still returns early on a rank without completion tokens, so the other ranks wait in the
    gather forever. PR #4041 (main 535a9678c; 0.23.1 and 0.24.0) pads with
    ``accelerator.pad_across_processes`` and a -1e9 sentinel, and every rank takes part.
    Where it shows: TRL 0.21.0 - 0.23.0 and the 0.21.0 - 0.23.1 dev builds between PR #3833 and PR #4041.
    TRL 0.20.0 computes the quantile of each rank's own tokens (a module-level function, no
    collective): a silent per-rank threshold, not this bug, left alone.

How the probe recognises it
    ``GRPOTrainer.get_high_entropy_mask`` (comments dropped) calls ``self.accelerator.gather(`` and
    never ``pad_across_processes``: both the 0.21/0.22 gather of unequal lengths and the 0.23.0
    early return. No method (TRL 0.20) or ``pad_across_processes`` (0.23.1+): not needed. A method
    with neither: undecided.

The fix
    ``GRPOTrainer.get_high_entropy_mask`` is replaced with TRL 0.24.0's body: pad this rank's
    non-padding entropies across processes with -1e9, gather, drop the sentinel, take the quantile
    of the rest (no token on any rank: an all-False mask). Every rank joins both collectives, so
    all ranks get the same global threshold. The arguments are bound by name against TRL's own
    signature (0.21/0.22 also take an unused ``accelerator``). On one process
    (``accelerator.num_processes == 1``) TRL's own method runs: a gather there is the identity and
    cannot hang, and TRL's own unit tests (``GetHighEntropyMaskTester``, 0.21 - 0.23) call the
    method with a bare mock accelerator that has ``num_processes = 1`` and ``gather`` only.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: TRL 0.21.0 - 0.23.0 are no longer supported (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import inspect

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code

METHOD = "get_high_entropy_mask"
# Entropies are >= 0: the sentinel cannot be a real value (TRL 0.24.0's choice).
PAD_VALUE = -1e9


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return not_needed("GRPOTrainer has no get_high_entropy_mask (TRL 0.20 takes a per-rank quantile, no collective)")
    body = code(method)
    if "pad_across_processes" in body:
        return not_needed("get_high_entropy_mask pads across processes before gathering")
    if "self.accelerator.gather(" in body:
        return needed(
            "get_high_entropy_mask gathers the entropies without accelerator.pad_across_processes: "
            "ranks with different numbers of completion tokens (or none) hang in the gather"
        )
    return undecided("get_high_entropy_mask neither gathers through self.accelerator nor pads across processes")


def high_entropy_mask(accelerator, entropies, mask, threshold):
    """TRL 0.24.0's ``get_high_entropy_mask``: the tokens whose entropy reaches the ``threshold``
    quantile of all ranks' non-padding entropies."""
    import torch

    local = entropies[mask.bool()].float()
    padded = accelerator.pad_across_processes(local, dim=0, pad_index=PAD_VALUE)
    gathered = accelerator.gather(padded)
    gathered = gathered[gathered != PAD_VALUE]
    if gathered.numel() == 0:
        return torch.zeros_like(entropies, dtype=torch.bool)
    entropy_threshold = torch.quantile(gathered, threshold)
    masked_entropies = entropies * mask.float()
    entropy_mask = masked_entropies >= entropy_threshold
    return entropy_mask & mask.bool()


def apply(module, patcher):
    def factory(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def get_high_entropy_mask(self, *args, **kwargs):
            if getattr(self.accelerator, "num_processes", None) == 1:
                return original(self, *args, **kwargs)  # no collective to hang in: TRL's own path
            arguments = signature.bind(self, *args, **kwargs).arguments
            return high_entropy_mask(self.accelerator, arguments["entropies"], arguments["mask"], arguments["threshold"])

        return get_high_entropy_mask

    patcher.wrap(module.GRPOTrainer, METHOD, factory)
