"""Which matrix cells run the tests that check trl_compat's own machinery on a real TRL.

Such a test (a fresh interpreter importing trl_compat and TRL in some order, from two threads, the
report's subprocesses) checks the engine, not a patch: its outcome does not depend on the TRL
release as a patch's does, but it costs 10 - 40 s a cell. It runs in the cells of ``ENGINE_CELLS``,
none, then one per era of TRL's code (0.15's trainer, 0.22's, 1.0's generation package, the newest),
and in every local run (``TRL_COMPAT_CELL`` unset); the other cells skip it with this reason.

A patch's fault tests (``tests/engine/test_faults.py``: break its target, make its probe or apply raise,
revert and reinstall it) run in the default cells at the two ends of its window (``window_end_cells``):
what they drive is the engine's undo on that patch's targets, whose shape changes across the window, not
in each cell inside it. The by-hand cells and local runs put every applied patch to them.
"""

import configparser
import os
import pathlib
import re

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


ROOT = pathlib.Path(__file__).resolve().parents[2]


def default_cells() -> list[str]:
    """The matrix cells of the default run: tox.ini's ``env_list`` entries that have ``matrix/cells/<cell>.txt``."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    entries = (line.split("#")[0].strip() for line in tox["tox"]["env_list"].splitlines())
    return [e for e in entries if e and (ROOT / "matrix" / "cells" / f"{e}.txt").exists()]


def _release_order(cell: str) -> tuple:
    """trl0.15.2-tf4.48.3-nopeft -> ((0, 15, 2), (4, 48, 3), "-nopeft"); trl-newest after every release."""
    found = re.match(r"trl([\d.]+)-tf([\d.]+)(.*)", cell)
    if not found:
        return ((float("inf"),), (), cell)
    trl, tf, rest = found.groups()
    return (tuple(int(x) for x in trl.split(".")), tuple(int(x) for x in tf.split(".")), rest)


def window_end_cells(patch_id: str) -> set[str]:
    """The oldest and the newest default cell where ``patch_id`` applies (tests/support/expected_status.py)."""
    from expected_status import APPLIED

    cells = sorted((c for c in default_cells() if patch_id in APPLIED.get(c, set())), key=_release_order)
    return {cells[0], cells[-1]} if cells else set()


def skip_inside_window(patch_id: str) -> None:
    """Skip a per-patch engine test in a default cell strictly inside ``patch_id``'s window."""
    if CELL and CELL in default_cells() and CELL not in window_end_cells(patch_id):
        ends = ", ".join(sorted(window_end_cells(patch_id)))
        pytest.skip(f"{patch_id}: the ends of its window run this (the cells {ends}; tests/support/cells.py)")
