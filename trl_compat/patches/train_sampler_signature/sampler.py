"""The sampler-method wrapper: a call the original accepts passes through untouched; the one
extra dataset argument is taken off, and the sampler TRL builds is pointed at that dataset, as
TRL 0.18 does."""

from __future__ import annotations

import functools
import inspect
import logging

log = logging.getLogger(__name__)

PATCH_ID = "train-sampler-signature"


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


def wrap(original, dataset_names):
    """The factory for ``Patcher.wrap``: ``dataset_names`` are the keyword names of the dataset."""
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
        except Exception:  # never break training over the retarget
            log.debug("trl_compat: %s: could not point the sampler at the given dataset", PATCH_ID, exc_info=True)
            return result

    # inspect.signature() shows what the wrapper takes, not the original's (self).
    extra = inspect.Parameter(dataset_names[0], inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)
    sampler.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])
    return sampler
