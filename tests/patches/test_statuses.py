"""Every patch's status in this matrix cell, checked against the one table
(tests/support/expected_status.py), and what the report says of the patches that apply.

The statuses come from ``python -m trl_compat --json``'s report (it imports every trigger module) taken
before any test ran, so the earlier tests of this session cannot change them: in a tox cell, the report
this session wrote before collecting a test (tests/conftest.py, TRL_COMPAT_CELL_REPORT); elsewhere a
fresh interpreter's."""

import importlib
import json
import os
import pathlib
import subprocess
import sys

from trl_compat.patches import PATCHES

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from expected_status import APPLIED, OPT_IN
from versions import installed

CELL = os.environ.get("TRL_COMPAT_CELL")
pytestmark = pytest.mark.skipif(CELL is None, reason="not a matrix cell (TRL_COMPAT_CELL unset)")

BY_ID = {patch.id: patch for patch in PATCHES}

# Where a patch applies, its reason names what the probe found in the real code.
APPLIED_REASONS = {
    "eval-before-train-ga": ["divides the loss by self.current_gradient_accumulation_steps"],
    "entropy-mask-gather-hang": ["without accelerator.pad_across_processes"],
    "generation-config-model-defaults": ["calls generate(generation_config=self.generation_config) without use_model_defaults"],
    "fsdp2-vllm-sync": ["FSDP2", "anything else runs TRL's code"],
    "grpo-eval-0.14": ["calls inputs.get(...)", "'list' object has no attribute 'get'"],
    "logps-attention-mask": ["without attention_mask"],
    "peft-optional": ["get_peft_model in GRPOTrainer.__init__"],
    "qlora-config-rebuild": ["rebuilds GRPOConfig with dataclasses.replace"],
    "qlora-peftmodel-frozen": ["freezes every parameter including the LoRA adapters"],
    "scale-rewards-swapped": ["scale_rewards labels are swapped"],
    "train-sampler-signature": [
        "sampler_fn(dataset) passes 1 positional argument(s)",
        "GRPOTrainer._get_train_sampler(self) cannot take",
    ],
    "zero3-hooks-api": ["renamed to _register_deepspeed_module"],
    "zero3-peft-mixed-dtype": ["without autocast_adapter_dtype"],
    "vllm-sleep-mode-weights": ["vllm_enable_sleep_mode", "syncs after every level-2 sleep"],
    "tools-colocate-llm-attr": ["self.vllm_generation.llm", "AttributeError"],
}

# Where the gate says "not needed", the probe says so too from the fixed code: it is what decides
# for the main-branch builds inside a window. Written against TRL's code up to 0.20.
FIXED_CODE_REASONS = {
    "logps-attention-mask": "passes the attention mask",
    "pad-token": "sets pad_token = eos_token",
    "peft-gradient-checkpointing": "_enable_gradient_checkpointing",
}


@pytest.fixture(scope="module")
def report(request):
    # in a tox cell this session wrote the report before its first test (tests/conftest.py), beside the
    # JUnit XML: read it rather than pay a fresh interpreter
    xml = getattr(request.config.option, "xmlpath", None)
    written = pathlib.Path(xml).with_suffix(".json") if xml else None
    if written is not None and written.exists():
        text = written.read_text()
    else:
        out = subprocess.run([sys.executable, "-m", "trl_compat", "--json"], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr
        text = out.stdout
    return {rec["id"]: rec for rec in json.loads(text)["patches"]}


# Patches the cell switches off (tox.ini sets TRL_COMPAT_DISABLE for it): "disabled" whatever the probe finds.
SWITCHED_OFF = {i.strip() for i in os.environ.get("TRL_COMPAT_DISABLE", "").split(",") if i.strip()}


def expected(patch_id):
    if patch_id in SWITCHED_OFF:
        return "disabled"
    if patch_id in APPLIED[CELL]:
        return "applied"
    return "disabled" if patch_id in OPT_IN.get(CELL, ()) else "not needed"


def test_the_table_knows_this_cell_and_every_patch(report):
    assert CELL in APPLIED, f"add cell {CELL} to tests/support/expected_status.py"
    assert set(report) == set(BY_ID)
    assert APPLIED[CELL] | OPT_IN.get(CELL, set()) <= set(BY_ID)


@pytest.mark.parametrize("patch_id", sorted(BY_ID))
def test_status(report, patch_id):
    record = report[patch_id]
    assert record["status"] == expected(patch_id), record
    if record["status"] == "applied":
        for snippet in APPLIED_REASONS.get(patch_id, ()):
            assert snippet in record["reason"], record


@pytest.mark.parametrize("patch_id", sorted(FIXED_CODE_REASONS))
def test_probe_recognises_the_fixed_code(patch_id):
    trl, patch = installed("trl"), BY_ID[patch_id]
    if trl is None or trl >= Version("0.21") or SpecifierSet(patch.requires["trl"]).contains(trl, prereleases=True):
        pytest.skip(f"trl {trl}: not a fixed release the probe was written against")
    verdict = patch.probe(importlib.import_module(patch.trigger))
    assert verdict.needed is False and FIXED_CODE_REASONS[patch_id] in verdict.reason, verdict


def test_every_vllm_patch_needs_vllm_installed(report):
    """A patch for TRL's vLLM path says "not needed: vllm is not installed" without vLLM, as all
    of them do (use_vllm=True cannot run without it); none says "applied" there."""
    for patch in PATCHES:
        if "vllm" in patch.id:
            assert "vllm" in patch.requires, patch.id
    if installed("vllm") is not None:
        return
    trl = installed("trl")
    for patch_id, record in report.items():
        if "vllm" in patch_id:
            assert record["status"] == "not needed", record
            if trl is not None and SpecifierSet(BY_ID[patch_id].requires["trl"]).contains(trl, prereleases=True):
                assert record["reason"] == "vllm is not installed", record
