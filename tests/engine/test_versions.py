"""trl_compat._engine.versions and .pep440: the version gate gives packaging's verdicts,
reads the versions importlib.metadata reads, and needs neither at start-up. No trl needed."""

import importlib.metadata
import itertools
import sys

import trl_compat
from trl_compat import _engine as engine
from trl_compat._engine import Patch, pep440
from trl_compat._engine import versions as engine_versions
from trl_compat.patches import PATCHES

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version


@pytest.mark.parametrize(
    "installed, window, expected",
    [
        ("0.15.0", ">=0.15.0.dev0,<0.15.1", None),
        ("0.15.0.dev0", ">=0.15.0.dev0,<0.15.1", None),
        ("0.15.0+cu124", ">=0.15.0.dev0,<0.15.1", None),
        ("0.14.0", "<0.16", None),
        ("0.15.1", ">=0.15.0.dev0,<0.15.1", trl_compat.NOT_NEEDED),
        ("0.16.0.dev0", "<0.16", trl_compat.NOT_NEEDED),
        ("1.16.0", "<0.20", trl_compat.NOT_NEEDED),
        ("not a version", "<0.20", trl_compat.UNKNOWN_VERSION),
    ],
)
def test_version_gate(monkeypatch, installed, window, expected):
    monkeypatch.setattr(engine_versions, "dist_version", lambda dist: installed)
    patch = Patch(
        id="test-gate",
        summary="",
        upstream="",
        trigger="x",
        must_exist="y",
        changes=("y",),
        requires={"trl": window},
        probe=None,
        apply=None,
    )
    status, reason, versions = engine.gate(patch)
    assert status == expected, reason
    assert versions == {"trl": installed}
    if expected == trl_compat.UNKNOWN_VERSION:
        assert repr(installed) in reason


def test_version_gate_without_metadata(monkeypatch):
    monkeypatch.setattr(engine_versions, "dist_version", lambda dist: None)
    missing = Patch(
        id="test-gate",
        summary="",
        upstream="",
        trigger="x",
        must_exist="y",
        changes=("y",),
        requires={"surely-not-installed-dist": ">=0"},
        probe=None,
        apply=None,
    )
    assert engine.gate(missing)[0] == trl_compat.NOT_NEEDED
    # importable but no metadata (e.g. a source checkout on sys.path): unknown, not guessed
    importable = Patch(
        id="test-gate",
        summary="",
        upstream="",
        trigger="x",
        must_exist="y",
        changes=("y",),
        requires={"json": ">=0"},
        probe=None,
        apply=None,
    )
    status, reason, _ = engine.gate(importable)
    assert status == trl_compat.UNKNOWN_VERSION and "no distribution metadata" in reason


@pytest.mark.parametrize(
    "since, fixed_in, inside, outside",
    [
        (
            "0.14.0",
            "0.15.0",
            ["0.14.0.dev0", "0.14.0", "0.14.1", "0.15.0.dev0", "0.15.0.dev0+g1f344c9"],
            ["0.13.9", "0.15.0a1", "0.15.0rc1", "0.15.0", "0.16.0.dev0"],
        ),
        ("0.15.0", "0.16.0", ["0.15.0.dev0", "0.15.2", "0.16.0.dev0", "0.16.0.dev3"], ["0.14.0", "0.16.0", "0.16.0rc0"]),
        ("0.18.0", None, ["0.18.0.dev0", "0.19.1", "1.16.0"], ["0.17.0", "0.17.1.dev0"]),
    ],
)
def test_affected_holds_the_dev_builds_at_both_ends(since, fixed_in, inside, outside):
    from packaging.specifiers import SpecifierSet

    window = SpecifierSet(engine.affected(since, fixed_in), prereleases=True)
    assert [v for v in inside if v not in window] == []
    assert [v for v in outside if v in window] == []


# Every version and window the gate meets, plus the corners of PEP 440 around them.
VERSIONS = [
    "0",
    "0.0.dev0",
    "0.14.0",
    "0.14.0.dev0",
    "0.15",
    "0.15.0",
    "0.15.0.dev0",
    "0.15.0.dev3",
    "0.15.0a0",
    "0.15.0a1",
    "0.15.0b2",
    "0.15.0rc1",
    "0.15.0c1",
    "0.15.0pre1",
    "0.15.0.post1",
    "0.15.0-1",
    "0.15.0.post1.dev2",
    "0.15.0rc1.post1",
    "0.15.0rc1.dev1",
    "0.15.0+cu124",
    "0.15.0.dev0+g1f344c9",
    "0.15.1",
    "0.15.2",
    "0.16.0.dev0",
    "0.16.0rc0",
    "0.16.0",
    "0.19.1",
    "0.20.0.dev0",
    "0.20.0a0",
    "1.16.0",
    "1!0.1",
    "v0.15.0",
    " 0.15.0 ",
    "4.48.3",
    "4.53.3",
    "5.0.0.dev0",
    "5.0.0rc1",
    "5.23.0",
    "0.8.0",
    "0.9.1",
    "0.16.3",
    "0.19.8",
    "0.15.0.DEV1",
    "0.15.0-alpha-2",
    "not a version",
    "0.15..0",
    "",
]
WINDOWS = sorted(
    {spec for patch in PATCHES for spec in patch.requires.values()}
    | {
        ">=0",
        "<0.16",
        ">=0.15.0.dev0,<0.15.1",
        "<=0.15.0",
        ">0.15.0",
        "==0.15",
        "!=0.15.0",
        ">=1!0",
        "<0.15.0",
        ">0.15.0.dev0",
        "~=0.15.0",
        "==0.15.*",
        ">=0.15.0+local",
        "",
        "lolwat",
        "<0.15.0a0",
        "<0.15.0rc1",
        ">0.15.0.post1",
        "<0.15.0.dev0",
        ">0.15.0a0",
        "<0.15.0.post1",
    }
)


def packaging_says(spec, raw):
    try:
        version = Version(raw)
    except InvalidVersion:
        return "invalid version"
    try:
        return SpecifierSet(spec, prereleases=True).contains(version)
    except InvalidSpecifier:
        return "invalid window"


@pytest.mark.parametrize("spec", WINDOWS)
def test_pep440_answers_as_packaging_or_defers(spec):
    answered = 0
    for raw in VERSIONS:
        parsed = pep440.parse(raw)
        if parsed is None:
            assert packaging_says(">=0", raw) == "invalid version", raw
            continue
        mine = pep440.contains(spec, parsed)
        if mine is not None:
            answered += 1
            assert mine == packaging_says(spec, raw), (spec, raw)
    assert answered or spec in ("", "lolwat", "~=0.15.0", "==0.15.*", ">=0.15.0+local")


@pytest.mark.parametrize(
    "installed",
    [
        "0.14.0",
        "0.15.0",
        "0.15.1",
        "0.15.2",
        "0.16.0",
        "0.16.1",
        "0.17.0",
        "0.18.2",
        "0.19.0",
        "0.19.1",
        "0.20.0",
        "1.16.0",
        "4.48.3",
        "4.52.4",
        "5.0.0",
        "5.23.0",
        "0.16.4",
        "0.8.5",
        "0.9.1",
    ],
)
def test_released_versions_need_no_packaging(installed):
    """Released versions (what the matrix cells and most users have) against every patch's
    windows are answered at start-up, without importing packaging."""
    for patch in PATCHES:
        for spec in patch.requires.values():
            assert pep440.contains(spec, pep440.parse(installed)) is not None, (patch.id, spec, installed)


@pytest.mark.parametrize("raw", [v for v in VERSIONS if pep440.parse(v) is not None])
def test_pep440_parts_are_packagings(raw):
    parsed, theirs = pep440.parse(raw), Version(raw)
    assert parsed.base_version == theirs.base_version
    assert (parsed.pre is None, parsed.dev, parsed.local) == (theirs.pre is None, theirs.dev, theirs.local)


def test_pep440_order_is_packagings():
    plain = [v for v in VERSIONS if pep440.parse(v) is not None and "+" not in v]
    for a, b in itertools.combinations(plain, 2):
        mine = pep440.parse(a).key(), pep440.parse(b).key()
        assert (mine[0] < mine[1], mine[0] == mine[1]) == (Version(a) < Version(b), Version(a) == Version(b)), (a, b)


@pytest.mark.parametrize("spec", WINDOWS)
def test_the_gate_gives_packagings_verdict(monkeypatch, spec):
    for installed in VERSIONS:
        monkeypatch.setattr(engine_versions, "dist_version", lambda dist, installed=installed: installed)
        patch = Patch(
            id="test-gate",
            summary="",
            upstream="",
            trigger="x",
            must_exist="y",
            changes=("y",),
            requires={"trl": spec},
            probe=None,
            apply=None,
        )
        status, reason, _ = engine.gate(patch)
        theirs = packaging_says(spec, installed)
        expected = {
            "invalid version": trl_compat.UNKNOWN_VERSION,
            "invalid window": trl_compat.FAILED,
            True: None,
            False: trl_compat.NOT_NEEDED,
        }[theirs]
        assert status == expected, (spec, installed, reason)


@pytest.mark.every_cell  # reads the installed stack
def test_dist_version_reads_what_importlib_metadata_reads():
    names = {d.metadata["Name"] for d in importlib.metadata.distributions()} | {"surely-not-installed-dist"}
    for name in sorted(n for n in names if n):
        try:
            expected = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            expected = None
        assert engine.dist_version(name) == expected, name
    for spelling in ("Trl", "trl", "TRL"):  # normalised as importlib.metadata does
        assert engine.dist_version(spelling) == engine.dist_version("trl")


def test_dist_version_defers_to_importlib_metadata_for_a_zip_on_sys_path(tmp_path, monkeypatch):
    import zipfile

    archive = tmp_path / "zipped.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("zipdist-1.2.3.dist-info/METADATA", "Metadata-Version: 2.1\nName: zipdist\nVersion: 1.2.3\n\n")
    monkeypatch.setattr(sys, "path", [str(archive)] + sys.path)
    assert engine.dist_version("zipdist") == "1.2.3"


@pytest.mark.parametrize("raw", VERSIONS + ["2.13.0+cpu", "0.8.5.post2", "1.0.dev", "0.15.0+CU1", "0.15.0.dev0.post1"])
def test_pep440_normal_form_reader_agrees_with_the_pattern(raw):
    """The reader that runs at start-up without ``re`` answers only for PEP 440's normal form, and
    then exactly as the full pattern does; anything else it leaves to the pattern."""
    normal = pep440._parse_normal(raw)
    if normal is not None:
        assert normal == pep440._parse_pattern(raw)
        assert str(Version(raw)) == raw  # it is the normal form
    else:
        assert pep440._parse_pattern(raw) is None or str(Version(raw)) != raw
