"""The README's main job, ``examples/grpo_cpu.py``: its before/after must keep showing the fixes.

* Its pins (``examples/requirements.txt``) are the cell trl0.15.0-tf4.48.3's, less the vLLM stand-in.
* Its exit status is 1 when a "before" run does not show the bug or an "after" run not the fix
  (results made up here, no training).
* The real before/after of ``logps-temperature``, in the cells whose TRL has the bug where the example
  measures it (0.15.x's ``_get_per_token_logps``): without the fix the log-probs are at temperature
  1, with it at the sampling temperature 0.9; generation is the same in both (same rewards at
  step 1), the gradient is not.
"""

import importlib.util
import os

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CELL = os.path.join(ROOT, "matrix", "cells", "trl0.15.0-tf4.48.3.txt")
STANDIN = "./tests/vllm_standin"
TRL = installed("trl")


@pytest.fixture
def example():
    spec = importlib.util.spec_from_file_location("grpo_cpu", os.path.join(ROOT, "examples", "grpo_cpu.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def requirement_lines(path):
    with open(path) as f:
        return [line.strip() for line in f if line.strip() and not line.startswith("#")]


# What the example does not use, so does not install: the vLLM stand-in, and DeepSpeed with the
# packages only DeepSpeed 0.16.3 pulls in (its requirements: einops, hjson, msgpack, ninja,
# py-cpuinfo, pydantic; numpy, packaging, psutil, torch and tqdm stay: others need them too).
NOT_USED = (
    "./tests/vllm_standin",
    "deepspeed",
    "einops",
    "hjson",
    "msgpack",
    "ninja",
    "py-cpuinfo",
    "pydantic",
    "pydantic_core",
    "annotated-types",
    "typing-inspection",
)


def test_example_pins_are_the_cell_without_what_it_does_not_use():
    cell = requirement_lines(CELL)
    assert STANDIN in cell and any(line.startswith("deepspeed==") for line in cell)
    kept = [line for line in cell if line.split("==")[0] not in NOT_USED]
    assert requirement_lines(os.path.join(ROOT, "examples", "requirements.txt")) == kept


def test_the_example_clears_the_settings_it_inherits(example, monkeypatch):
    monkeypatch.setenv("TRL_COMPAT_STRICT", "1")
    monkeypatch.setenv("TRL_COMPAT_GUARD", "strict")
    monkeypatch.setenv("TRL_COMPAT_DISABLE", "pad-token")
    seen = {}

    def fake_run(cmd, env, **kwargs):
        seen.update(env)

        class Done:
            returncode = 0
            stdout = 'RESULT {"ok": 1}\n'
            stderr = ""

        return Done()

    monkeypatch.setattr(example.subprocess, "run", fake_run)
    example.run_tiny_grpo("pad-token", fix_on=True)
    assert not [name for name in seen if name.startswith("TRL_COMPAT_")], seen
    example.run_tiny_grpo("logps-temperature", fix_on=False)
    assert {n: v for n, v in seen.items() if n.startswith("TRL_COMPAT_")} == {
        "TRL_COMPAT_LOGPS_TEMPERATURE": "1",
        "TRL_COMPAT_DISABLE": "logps-temperature",
    }


def made_up(fix, **fields):
    result = {
        "fix": fix,
        "trl": "0.15.0",
        "transformers": "4.48.3",
        "torch": "2.13.0",
        "status": "applied",
        "error": None,
        "sampling_temperature": 0.9,
        "logps_temperatures": [0.9],
        "pad_token": "</s>",
        "steps": [{"loss": 0.0, "grad_norm": 1.0, "kl": 0.0, "reward": 1.0}] * 3,
    }
    return {**result, **fields}


GOOD_BEFORE = {
    "pad-token": made_up(
        "pad-token",
        status="disabled",
        error="ValueError: Asking to pad but the tokenizer does not have a padding token. Please select a token",
        steps=[],
        pad_token=None,
    ),
    "logps-temperature": made_up("logps-temperature", status="disabled", logps_temperatures=[1.0]),
}


@pytest.mark.parametrize("fix", sorted(GOOD_BEFORE))
def test_exit_status_says_whether_each_run_showed_what_it_should(example, monkeypatch, capsys, fix):
    monkeypatch.setattr(example, "short_report", lambda: ["(the report)"])  # a process of its own: not what this tests

    def runs(before, after):
        monkeypatch.setattr(example, "run_tiny_grpo", lambda fix, fix_on: after if fix_on else before)
        return example.main([fix])

    assert runs(GOOD_BEFORE[fix], made_up(fix)) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK: each bug shown without its fix, and fixed with it")
    # the fix did nothing: the "after" run is the "before" run
    assert runs(GOOD_BEFORE[fix], GOOD_BEFORE[fix]) == 1
    assert f"FAILED {fix}: the run with the fix did not show it working" in capsys.readouterr().out
    # a TRL without the bug: nothing to show
    assert runs(made_up(fix), made_up(fix)) == 1
    assert f"FAILED {fix}: the run without the fix did not show the bug" in capsys.readouterr().out


@pytest.mark.skipif(
    TRL is None or not Version("0.15.0") <= TRL < Version("0.16.0"),
    reason=f"TRL {TRL}: the example measures logps-temperature's bug in TRL 0.15.x's "
    "_get_per_token_logps (0.14.0 computes log-probs inside compute_loss; 0.16.0 fixed it)",
)
# 70 - 80 s a cell, and the three 0.15.2 default cells run the same TRL code: one of them, and 0.15.0's
@only_in_cells("trl0.15.2-tf4.48.3", "trl0.15.0-tf4.48.3", why="the README example's two tiny runs on TRL 0.15.x")
def test_logps_temperature_before_and_after(example):
    before, after = example.before_after("logps-temperature")
    assert (before["status"], after["status"]) == ("disabled", "applied")
    assert before["trl"] == after["trl"] == str(TRL)
    for result in (before, after):
        assert result["error"] is None and len(result["steps"]) == 3, result
        assert result["sampling_temperature"] == 0.9  # TRL's default
    assert before["logps_temperatures"] == [1.0]  # the bug
    assert after["logps_temperatures"] == [0.9]  # the fix
    # Same seed, same model: the first completions (and so rewards) are the same, sampling is
    # untouched by the fix; the gradient they give is not.
    assert before["steps"][0]["reward"] == after["steps"][0]["reward"]
    assert abs(before["steps"][0]["grad_norm"] - after["steps"][0]["grad_norm"]) > 0.01
