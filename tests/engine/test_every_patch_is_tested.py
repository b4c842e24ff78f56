"""Every patch id is named by a test that proves its fix (runs in every cell, no trl needed).

A test names the patch it proves by its id, as a string (``unpatched("pad-token")``,
``PATCH_ID = "pad-token"``). The status table and the tests that loop over the whole registry
name ids too, but prove no fix: they do not count."""

import pathlib
import re

from trl_compat.patches import PATCHES

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]

# The one hand-written statement of what each cell shows, and the tests that check every entry alike.
REGISTRY_WIDE = {
    "support/expected_status.py",
    "engine/test_every_patch_is_tested.py",
    "engine/test_registry.py",
    "engine/test_windows.py",
    "patches/test_declared_changes.py",
    "patches/test_statuses.py",
}


def _sources():
    for path in sorted(TESTS.rglob("*.py")):
        where = path.relative_to(TESTS).as_posix()
        if where not in REGISTRY_WIDE:
            yield where, path.read_text(encoding="utf-8")


SOURCES = dict(_sources())


def naming(patch_id: str):
    quoted = re.compile(rf"""["']{re.escape(patch_id)}["']""")
    return sorted(where for where, text in SOURCES.items() if quoted.search(text))


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_a_test_names_the_patch(patch):
    assert naming(patch.id), f"no test names {patch.id!r}: name it in the test that proves its fix"


def test_registry_wide_files_exist():
    """A renamed registry-wide test would otherwise start counting as a patch's test."""
    assert all((TESTS / where).is_file() for where in REGISTRY_WIDE)
