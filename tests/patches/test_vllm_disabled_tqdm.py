"""vllm-disabled-tqdm gives advice, no fix: on TRL < 0.26 (or >= 1.3, which dropped TRL's own shim)
with vLLM < 0.11.1 and huggingface_hub 1.1 - 1.9 it says "undecided" and names the upgrade; elsewhere
(TRL 0.26 - 1.2: TRL's shim, read in its code) "not needed".
No cell installs that stack (the vLLM stand-in cells have huggingface_hub 0.36.2, the
huggingface_hub 2.x cells no vLLM and are past the window), so the versions are given to the gate."""

import trl_compat

import pytest

from advice import in_window, probe, run_through_engine, shim_modules

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
        {"vllm": None},
    ],
)
def test_a_fixed_or_unaffected_stack_is_not_needed(monkeypatch, fixed):
    inside, reason = in_window(monkeypatch, PATCH_ID, {**BROKEN, **fixed})
    assert not inside, reason


# TRL 1.2.0's trl/_compat.py (abridged) and 1.3.0's, after PR #5549 removed the vLLM shims
TRL_1_2_COMPAT = """
def _patch_vllm_disabled_tqdm() -> None:
    if _is_package_version_below("vllm", "0.11.1"):
        try:
            import vllm.model_executor.model_loader.weight_utils
            from tqdm import tqdm

            class DisabledTqdm(tqdm):
                def __init__(self, *args, **kwargs):
                    kwargs["disable"] = True
                    super().__init__(*args, **kwargs)

            vllm.model_executor.model_loader.weight_utils.DisabledTqdm = DisabledTqdm
        except (ImportError, AttributeError) as e:
            warnings.warn(f"Failed to patch vLLM DisabledTqdm: {e}", stacklevel=2)
"""
TRL_1_3_COMPAT = """
def _patch_vllm_logging() -> None:
    pass
"""


def test_trl_0_26_to_1_2_shim_it_themselves(monkeypatch, tmp_path):
    stack = {**BROKEN, "trl": "1.2.0"}
    assert in_window(monkeypatch, PATCH_ID, stack) == (True, "")  # the window is open-ended: the probe reads TRL
    shim_modules(monkeypatch, tmp_path, TRL_1_2_COMPAT)
    verdict = declared_probe()
    assert verdict.needed is False and "TRL replaces vLLM's DisabledTqdm itself" in verdict.reason


def test_trl_1_3_dropped_the_shim(monkeypatch, tmp_path):
    stack = {**BROKEN, "trl": "1.3.0"}
    assert in_window(monkeypatch, PATCH_ID, stack) == (True, "")
    shim_modules(monkeypatch, tmp_path, TRL_1_3_COMPAT)
    verdict = declared_probe()
    assert verdict.needed is None and "upgrade vllm to 0.11.1 or newer" in verdict.reason


def declared_probe():
    from trl_compat.patches import declared

    return declared(PATCH_ID).probe(None)


def test_the_shim_read_in_the_installed_trl():
    """Every cell: TRL's own code has the shim exactly in TRL 0.26.0 - 1.2.x."""
    from trl_compat.patches._advice import trl_shims

    from packaging.version import Version

    from versions import installed

    trl = installed("trl")
    shimmed = trl is not None and Version("0.26.0") <= trl < Version("1.3.0")
    assert trl_shims("weight_utils.DisabledTqdm = DisabledTqdm") is shimmed
    assert trl_shims("vllm.transformers_utils.tokenizer.get_cached_tokenizer = get_cached_tokenizer") is shimmed


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
