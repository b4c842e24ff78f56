"""vllm-disabled-tqdm gives advice, no fix: on TRL < 0.26 with vLLM < 0.11.1 and
huggingface_hub 1.1 - 1.9 it says "undecided" and names the upgrade; elsewhere "not needed".
No cell installs that stack (the vLLM stand-in cells have huggingface_hub 0.36.2, the
huggingface_hub 2.x cells no vLLM and are past the window), so the versions are given to the gate."""

import trl_compat

import pytest

from advice import in_window, probe, run_through_engine

PATCH_ID = "vllm-disabled-tqdm"
BROKEN = {"trl": "0.24.0", "vllm": "0.10.2", "huggingface_hub": "1.2.0"}


def test_the_broken_stack_is_in_the_window_and_the_probe_names_the_upgrade(monkeypatch):
    assert in_window(monkeypatch, PATCH_ID, BROKEN) == (True, "")
    verdict = probe(monkeypatch, PATCH_ID, BROKEN)
    assert verdict.needed is None
    assert "upgrade vllm to 0.11.1 or newer" in verdict.reason
    assert "vllm 0.10.2, huggingface_hub 1.2.0" in verdict.reason
    assert "got multiple values for keyword argument 'disable'" in verdict.reason


@pytest.mark.parametrize(
    "fixed",
    [
        {"vllm": "0.11.1"},  # vLLM's fix
        {"huggingface_hub": "0.36.2"},  # what transformers 4.x pins
        {"huggingface_hub": "1.0.1"},  # before snapshot_download passed disable=
        {"huggingface_hub": "1.10.0"},  # passes disable= only to its own tqdm classes
        {"huggingface_hub": "2.4.0"},
        {"trl": "0.26.0"},  # TRL's own shim
        {"vllm": None},
    ],
)
def test_a_fixed_or_unaffected_stack_is_not_needed(monkeypatch, fixed):
    inside, reason = in_window(monkeypatch, PATCH_ID, {**BROKEN, **fixed})
    assert not inside, reason


def test_without_vllm_the_gate_says_so(monkeypatch):
    assert in_window(monkeypatch, PATCH_ID, {**BROKEN, "vllm": None}) == (False, "vllm is not installed")


def test_the_engine_reports_undecided_and_never_applies(monkeypatch, tmp_path):
    status, reason = run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN)
    assert status == trl_compat.UNDECIDED and "upgrade vllm to 0.11.1" in reason


def test_a_strict_run_stops_with_the_upgrade(monkeypatch, tmp_path):
    with pytest.raises(trl_compat.TrlCompatError, match="undecided: .*upgrade vllm to 0.11.1"):
        run_through_engine(monkeypatch, tmp_path, PATCH_ID, BROKEN, strict=True)


def test_apply_refuses():
    from trl_compat.patches import vllm_disabled_tqdm

    with pytest.raises(NotImplementedError, match="only advises"):
        vllm_disabled_tqdm.apply(None, None)
