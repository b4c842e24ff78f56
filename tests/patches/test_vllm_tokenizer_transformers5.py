"""vllm-tokenizer-transformers5 gives advice, no fix: on TRL < 0.26 (or >= 1.3, which dropped TRL's
own shim) with vLLM < 0.12 and transformers 5 it says "undecided" and names the upgrade; elsewhere
(TRL 0.26 - 1.2: TRL's shim, read in its code) "not needed". No cell installs
that stack (no transformers-5 cell has vLLM), so the versions are given to the gate; the probe
reads the real transformers of the cell."""

import trl_compat

import pytest

from advice import in_window, probe, run_through_engine, shim_modules
from versions import installed

PATCH_ID = "vllm-tokenizer-transformers5"
BROKEN = {"trl": "0.24.0", "vllm": "0.10.2", "transformers": "5.2.0"}


class TokenizerWithoutExtended:
    """transformers 5's PreTrainedTokenizerBase as far as the probe looks."""


@pytest.fixture
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture
def without_extended(monkeypatch, transformers):
    monkeypatch.setattr(transformers, "PreTrainedTokenizerBase", TokenizerWithoutExtended)


def test_the_broken_stack_is_in_the_window(monkeypatch):
    assert in_window(monkeypatch, PATCH_ID, BROKEN) == (True, "")


def test_the_probe_names_the_upgrade_where_the_property_is_gone(monkeypatch, without_extended):
    verdict = probe(monkeypatch, PATCH_ID, BROKEN)
    assert verdict.needed is None
    assert "upgrade vllm to 0.12.0 or newer" in verdict.reason and "vllm 0.10.2, transformers 5.2.0" in verdict.reason


@pytest.mark.every_cell
def test_the_probe_on_this_cells_transformers(monkeypatch, transformers):
    verdict = probe(monkeypatch, PATCH_ID, BROKEN)
    if installed("transformers").major >= 5:
        assert verdict.needed is None and "all_special_tokens_extended" in verdict.reason
    else:  # transformers 4.x has the property vLLM reads
        assert verdict.needed is False and "still has" in verdict.reason


@pytest.mark.parametrize("fixed", [{"vllm": "0.12.0"}, {"transformers": "4.57.6"}, {"vllm": None}])
def test_a_fixed_or_unaffected_stack_is_not_needed(monkeypatch, fixed):
    inside, reason = in_window(monkeypatch, PATCH_ID, {**BROKEN, **fixed})
    assert not inside, reason


# TRL 1.2.0's trl/_compat.py (abridged: the shim's last line) and 1.3.0's, after PR #5549 removed it
TRL_1_2_COMPAT = """
def _patch_vllm_cached_tokenizer() -> None:
    if _is_package_version_at_least("transformers", "5.0.0") and _is_package_version_below("vllm", "0.12.0"):
        import vllm.transformers_utils.tokenizer

        def get_cached_tokenizer(tokenizer):
            return tokenizer

        vllm.transformers_utils.tokenizer.get_cached_tokenizer = get_cached_tokenizer
"""
TRL_1_3_COMPAT = """
def _patch_vllm_logging() -> None:
    pass
"""


@pytest.mark.parametrize("trl, source, needed", [("1.2.0", TRL_1_2_COMPAT, False), ("1.3.0", TRL_1_3_COMPAT, None)])
def test_trl_0_26_to_1_2_shim_it_and_1_3_dropped_it(monkeypatch, tmp_path, without_extended, trl, source, needed):
    stack = {**BROKEN, "trl": trl}
    assert in_window(monkeypatch, PATCH_ID, stack) == (True, "")  # the window is open-ended: the probe reads TRL
    shim_modules(monkeypatch, tmp_path, source)
    from trl_compat.patches import declared

    verdict = declared(PATCH_ID).probe(None)
    assert verdict.needed is needed, verdict
    if needed is None:
        assert "upgrade vllm to 0.12.0 or newer" in verdict.reason
    else:
        assert "TRL replaces vLLM's get_cached_tokenizer itself" in verdict.reason


def test_without_vllm_the_gate_says_so(monkeypatch):
    assert in_window(monkeypatch, PATCH_ID, {**BROKEN, "vllm": None}) == (False, "vllm is not installed")


def test_a_strict_run_stops_with_the_upgrade(monkeypatch, tmp_path, without_extended):
    status, reason = run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN)
    assert status == trl_compat.UNDECIDED and "upgrade vllm to 0.12.0" in reason
    with pytest.raises(trl_compat.TrlCompatError, match="undecided: .*upgrade vllm to 0.12.0"):
        run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN, strict=True)


def test_apply_refuses():
    from trl_compat.patches import vllm_tokenizer_transformers5

    with pytest.raises(NotImplementedError, match="only advises"):
        vllm_tokenizer_transformers5.apply(None, None)


@pytest.mark.every_cell
def test_the_attribute_vllm_reads_by_the_real_tokenizer_of_this_cell(transformers):
    """The transformers half of the break, by value: vLLM < 0.12's get_cached_tokenizer reads
    tokenizer.all_special_tokens_extended, which a transformers-5 tokenizer no longer has."""
    from tiny import make_tokenizer

    tokenizer = make_tokenizer()
    if installed("transformers").major >= 5:
        with pytest.raises(AttributeError, match="all_special_tokens_extended"):
            tokenizer.all_special_tokens_extended
    else:
        assert tokenizer.eos_token in tokenizer.all_special_tokens_extended
