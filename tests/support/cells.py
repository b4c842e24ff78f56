"""Which matrix cells run the tests that check trl_compat's own machinery on a real TRL.

Such a test (a fresh interpreter importing trl_compat and TRL in some order, from two threads, the
report's subprocesses) checks the engine, not a patch: its outcome does not depend on the TRL
release as a patch's does, but it costs 10 - 40 s a cell. It runs in the cells of ``ENGINE_CELLS``,
none, then one per era of TRL's code (0.15's trainer, 0.22's, 1.0's generation package, the newest),
and in every local run (``TRL_COMPAT_CELL`` unset); the other cells skip it with this reason.
"""

import os

import pytest

ENGINE_CELLS = ("notrl", "trl0.15.2-tf4.48.3", "trl0.22.1-tf4.55.4", "trl1.0.0-tf4.57.6-ds0.19.2", "trl-newest")
CELL = os.environ.get("TRL_COMPAT_CELL", "")

engine_cells = pytest.mark.skipif(
    bool(CELL) and CELL not in ENGINE_CELLS,
    reason=f"trl_compat's machinery on a real TRL: run in the cells {', '.join(ENGINE_CELLS)} (tests/support/cells.py)",
)


def only_in_cells(*cells: str, why: str):
    """Skip a costly by-value test outside ``cells`` (one per shape of TRL's code it drives; every
    local run, ``TRL_COMPAT_CELL`` unset, runs it): the other cells in its window prove the patch's
    status, not again its values."""
    return pytest.mark.skipif(
        bool(CELL) and CELL not in cells,
        reason=f"{why}: run in the cells {', '.join(cells)} (tests/support/cells.py)",
    )
