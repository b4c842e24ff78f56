"""Each patch that applies in this cell changes only attributes its registry entry lists in
``changes``: its ``apply`` is run again, on the real TRL, with a fresh Patcher that records what
it sets."""

import importlib
import sys

import trl_compat
from trl_compat._engine.patcher import Patcher
from trl_compat.patches import PATCHES

import pytest

from unpatched import without_patch

TRIGGERS = sorted({patch.trigger for patch in PATCHES})


def qualified(patch, change: str) -> str:
    """A ``changes`` entry as ``Patcher.changed()`` names it: module, qualified name, attribute."""
    module, _, path = change.rpartition(":")
    return f"{module or patch.trigger}.{path}"


def _applied():
    for trigger in TRIGGERS:
        try:
            importlib.import_module(trigger)
        except ImportError:  # e.g. a trainer module whose optional packages are missing
            pass
    return [patch for patch in PATCHES if trl_compat.status(patch.id) == trl_compat.APPLIED]


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_apply_changes_only_what_the_entry_declares(patch):
    pytest.importorskip("trl")
    if patch not in _applied():
        pytest.skip(f"{patch.id} is not applied in this cell")
    with without_patch(patch.id):
        patcher = Patcher(patch.id)
        try:
            patch.apply(sys.modules[patch.trigger], patcher)
            changed = patcher.changed()
        finally:
            patcher.undo()
    assert changed, f"{patch.id}: apply changed nothing"
    declared = {qualified(patch, change) for change in patch.changes}
    assert set(changed) <= declared, f"{patch.id} changes {sorted(set(changed) - declared)}, not in its changes"


def test_qualified_names_follow_the_convention():
    patch = next(p for p in PATCHES if p.id == "transformers5-warnings-issued")
    assert qualified(patch, "GRPOTrainer.__init__") == f"{patch.trigger}.GRPOTrainer.__init__"
    assert (
        qualified(patch, "transformers.modeling_utils:PreTrainedModel.warnings_issued")
        == "transformers.modeling_utils.PreTrainedModel.warnings_issued"
    )
