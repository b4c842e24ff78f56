"""peft-transformers5-hybrid-cache gives advice, no fix: on TRL < 0.28 with transformers 5 and
peft < 0.18 it says "undecided" and names the upgrade; elsewhere "not needed". No cell installs
that stack (the transformers-5 cells have peft 0.21.2), so the versions are given to the gate;
the probe reads the real transformers of the cell."""

import trl_compat

import pytest

from advice import in_window, probe, run_through_engine
from versions import installed

PATCH_ID = "peft-transformers5-hybrid-cache"
BROKEN = {"trl": "0.24.0", "transformers": "5.2.0", "peft": "0.17.1"}


@pytest.fixture
def without_hybrid_cache(monkeypatch):
    cache_utils = pytest.importorskip("transformers.cache_utils")
    monkeypatch.delattr(cache_utils, "HybridCache", raising=False)


def test_the_broken_stack_is_in_the_window(monkeypatch):
    assert in_window(monkeypatch, PATCH_ID, BROKEN) == (True, "")


def test_the_probe_names_the_upgrade_where_hybrid_cache_is_gone(monkeypatch, without_hybrid_cache):
    verdict = probe(monkeypatch, PATCH_ID, BROKEN)
    assert verdict.needed is None
    assert "upgrade peft to 0.18.0 or newer" in verdict.reason and "peft 0.17.1, transformers 5.2.0" in verdict.reason


@pytest.mark.every_cell
def test_the_probe_on_this_cells_transformers(monkeypatch):
    pytest.importorskip("transformers")
    verdict = probe(monkeypatch, PATCH_ID, BROKEN)
    if installed("transformers").major >= 5:
        assert verdict.needed is None and "HybridCache" in verdict.reason
    else:  # transformers 4.x defines it
        assert verdict.needed is False and "still defines HybridCache" in verdict.reason


@pytest.mark.parametrize(
    "fixed", [{"peft": "0.18.0"}, {"transformers": "4.57.6"}, {"trl": "0.28.0"}, {"peft": None}, {"peft": "0.7.1"}]
)
def test_a_fixed_or_unaffected_stack_is_not_needed(monkeypatch, fixed):
    inside, reason = in_window(monkeypatch, PATCH_ID, {**BROKEN, **fixed})
    assert not inside, reason


def test_a_strict_run_stops_with_the_upgrade(monkeypatch, tmp_path, without_hybrid_cache):
    status, reason = run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN)
    assert status == trl_compat.UNDECIDED and "upgrade peft to 0.18.0" in reason
    with pytest.raises(trl_compat.TrlCompatError, match="undecided: .*upgrade peft to 0.18.0"):
        run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN, strict=True)


def test_apply_refuses():
    from trl_compat.patches import peft_transformers5_hybrid_cache

    with pytest.raises(NotImplementedError, match="only advises"):
        peft_transformers5_hybrid_cache.apply(None, None)
