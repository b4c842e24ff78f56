"""Every patch's version window holds the versions its docstring names, and the main-branch
builds around each bound (runs in every cell, no trl needed).

Each registry entry states ``witnesses={dist: {"inside": [...], "outside": [...]}}``: the
versions its module's docstring names as affected (or as ones where the probe decides), and
those it names as fixed or out of scope. Besides those, for the lowest inside release X and the lowest
outside release F above every inside one, ``X.dev0`` and ``F.dev0`` (main-branch builds: the
bug's first ones, and those before the fix commit) must be inside, ``F`` and ``F.rc1`` outside.
"""

import importlib

from trl_compat import _engine
from trl_compat._engine import versions as engine_versions
from trl_compat.patches import PATCHES

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ANY = "99.0"  # for a dist a patch only needs installed (deepspeed ">=0")


def expectations(named):
    """``[(version, inside?)]`` from a ``{"inside": [...], "outside": [...]}`` declaration."""
    inside = [Version(v) for v in named["inside"]]
    outside = [Version(v) for v in named.get("outside", ())]
    cases = [(str(v), True) for v in inside] + [(str(v), False) for v in outside]
    releases = [v for v in inside if not v.is_prerelease]
    if releases:
        cases.append((f"{min(releases).base_version}.dev0", True))
    above = [v for v in outside if not v.is_prerelease and v > max(inside)]
    if above:
        fix = min(above).base_version
        cases += [(f"{fix}.dev0", True), (fix, False), (f"{fix}rc1", False)]
    return list(dict.fromkeys(cases))


def gate_with(monkeypatch, patch, versions):
    monkeypatch.setattr(engine_versions, "dist_version", lambda dist: versions.get(dist))
    status, reason, _ = _engine.gate(patch)
    return status is None, reason


CASES = []
for _patch in PATCHES:
    _named = _patch.witnesses
    for _dist in _patch.requires:
        for _version, _inside in expectations(_named[_dist]) if _dist in _named else ():
            CASES.append(pytest.param(_patch, _dist, _version, _inside, id=f"{_patch.id}-{_dist}-{_version}"))


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_every_patch_names_its_versions(patch):
    named = patch.witnesses
    assert named, f"{patch.id} names no witnesses"
    assert getattr(importlib.import_module(patch.impl), "PATCH_ID", patch.id) == patch.id
    for dist, spec in patch.requires.items():
        if dist not in named:
            assert Version(ANY) in SpecifierSet(spec), f"{patch.id}: {dist} {spec} needs witnesses"
        else:
            assert named[dist]["inside"], f"{patch.id}: no affected {dist} version named"


@pytest.mark.parametrize("patch, dist, version, inside", CASES)
def test_window_holds_the_named_versions_and_the_dev_builds_around_them(monkeypatch, patch, dist, version, inside):
    named = patch.witnesses
    versions = {d: (named[d]["inside"][0] if d in named else ANY) for d in patch.requires}
    versions[dist] = version
    got, reason = gate_with(monkeypatch, patch, versions)
    assert got is inside, f"{patch.id}: {dist} {version} should be {'in' if inside else 'out of'} {patch.requires[dist]!r} ({reason})"


def test_affected_helper():
    spec = SpecifierSet(_engine.affected("0.15.0", "0.16.0"), prereleases=True)
    assert [
        v in spec for v in ("0.14.9", "0.15.0.dev0", "0.15.2", "0.16.0.dev0", "0.16.0.dev3", "0.16.0a1", "0.16.0rc1", "0.16.0")
    ] == [False, True, True, True, True, False, False, False]
    assert _engine.affected("5.0.0") == ">=5.0.0.dev0"
