"""vlm-mm-token-type-ids, the batch's side: what the processor made during one
``_generate_and_score_completions`` call on a batch with images, and the ``mm_token_type_ids`` widened to the
ids (zeros over the completion) that the batch hands the loss. The patch's docstring (the package's
``__init__``) says why."""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from trl_compat._engine import warn_once
from trl_compat._helpers.arguments import arguments

log = logging.getLogger("trl_compat.patches.vlm_mm_token_type_ids")

PATCH_ID = "vlm-mm-token-type-ids"
KEY = "mm_token_type_ids"
_IMAGE_KEYS = ("pixel_values", "image_grid_thw")


@dataclass
class _Batch:
    """One ``_generate_and_score_completions`` call on a batch with images."""

    trainer: Any
    handed: Any = None  # the mm_token_type_ids TRL handed a log-prob call, widened to its ids
    made: list = field(default_factory=list)  # those of each processor call that processed images

    def note(self, output: Any) -> None:
        if isinstance(output, Mapping) and output.get(KEY) is not None and any(k in output for k in _IMAGE_KEYS):
            self.made.append(output[KEY])


_BATCH: contextvars.ContextVar[_Batch | None] = contextvars.ContextVar("trl_compat_mm_batch", default=None)
_LOSS: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("trl_compat_mm_loss", default=None)


def widened(mm: Any, rows: int, width: int, completion: int, device: Any):
    """``mm`` as a ``(rows, width)`` tensor, zeros over the last ``completion`` columns where it covers the
    prompt only (``width - completion`` columns), as PR #5178 extends it, on ``device`` (the ids'); None where its
    shape fits neither."""
    import torch

    mm = torch.as_tensor(mm, device=device)
    if mm.dim() != 2 or mm.shape[0] != rows:
        return None
    if mm.shape[1] == width:
        return mm
    if completion > 0 and mm.shape[1] == width - completion:
        return torch.cat([mm, mm.new_zeros(rows, completion)], dim=1)
    return None


def _unfit(mm: Any, rows: int, width: int) -> None:
    warn_once(
        log,
        (PATCH_ID, "shape"),
        "trl_compat %s: mm_token_type_ids of shape %s fit neither the ids (%d x %d) nor their prompt; the forward runs without them",
        PATCH_ID,
        tuple(getattr(mm, "shape", ())),
        rows,
        width,
    )


# -- the processor: its outputs noted during a batch ---------------------------------------------------


@functools.cache
def recording(cls: type) -> type:
    """``cls`` whose calls note their output on the current batch (one subclass per class, same name)."""

    def __call__(self, *args, **kwargs):
        output = cls.__call__(self, *args, **kwargs)
        batch = _BATCH.get()
        if batch is not None:
            batch.note(output)
        return output

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, "_trl_compat_recording": True})


def _swap_class(obj: Any, cls: type) -> bool:
    try:
        obj.__class__ = cls
    except TypeError:
        return False
    return True


def _has_images(inputs: Any) -> bool:
    return bool(
        isinstance(inputs, list) and inputs and isinstance(inputs[0], Mapping) and ("image" in inputs[0] or "images" in inputs[0])
    )


def _for_output(batch: _Batch, output: dict):
    import torch

    if batch.handed is not None:
        return batch.handed
    prompt_ids: Any = output.get("prompt_ids")
    completion_ids: Any = output.get("completion_ids")
    if not (torch.is_tensor(prompt_ids) and torch.is_tensor(completion_ids)):
        return None
    rows, completion = prompt_ids.shape[0], completion_ids.shape[1]
    for made in reversed(batch.made):
        mm = widened(made, rows, prompt_ids.shape[1] + completion, completion, prompt_ids.device)
        if mm is not None:
            return mm
    _unfit(batch.made[-1], rows, prompt_ids.shape[1])
    return None


def _wrap_score(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        if not _has_images(arguments(original, self, *args, **kwargs).get("inputs")):
            return original(self, *args, **kwargs)
        batch = _Batch(self)
        processor = getattr(self, "processing_class", None)
        own = type(processor)
        swapped = processor is not None and not getattr(own, "_trl_compat_recording", False) and _swap_class(processor, recording(own))
        if processor is not None and not swapped and not getattr(own, "_trl_compat_recording", False):
            warn_once(
                log,
                (PATCH_ID, "processor"),
                "trl_compat %s: the processor (%s) takes no other class; only the mm_token_type_ids a log-prob call "
                "is handed reach the loss",
                PATCH_ID,
                own.__name__,
            )
        token = _BATCH.set(batch)
        try:
            output = original(self, *args, **kwargs)
        finally:
            _BATCH.reset(token)
            if swapped:
                processor.__class__ = own
        if isinstance(output, dict) and output.get(KEY) is None and (batch.handed is not None or batch.made):
            mm = _for_output(batch, output)
            if mm is not None:
                output[KEY] = mm
        return output

    return _generate_and_score_completions
