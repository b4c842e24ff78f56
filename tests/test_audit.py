"""``trl-compat audit`` on the cell's real stack, and the run-time warning of a real GRPOTrainer.

* The CLI (``python -m trl_compat --audit``, text and ``--json``) names the same bugs, each with
  what trl_compat does; ``--strict`` exits 1 exactly when one is not fixed here.
* TRL 0.22.1 (its cell): ``scale-rewards-swapped`` and the biased baseline of reward functions
  that return None (``none-reward-baseline``, TRL #5902, fixed in 1.6.0) are fixed (the patches applied).
* A GRPOTrainer built with a DoRA ``peft_config`` logs one WARNING per unfixed bug whose
  conditions the run meets: the DoRA magnitude frozen by bf16 rounding (TRL 0.26.0 - 1.14.x, fixed
  in 1.15.0) once ``dora-magnitude-bf16`` is reverted, none while it is applied; the same trainer
  with plain LoRA, or without PEFT, logs none of DoRA's.
"""

import json
import logging
import os
import subprocess
import sys

import pytest
from packaging.version import Version

from cells import engine_cells
from versions import installed

TRL = installed("trl")
# The CLI's own behaviour (text = JSON, --strict) reads nothing of a release but its bugs: one cell with
# TRL proves it, the 0.22.1 cell of this example, and notrl without TRL (each call is a process
# that imports TRL, ~10 s, so not in every cell).
CLI_CELL = os.environ.get("TRL_COMPAT_CELL", "") in ("", "notrl", "trl0.22.1-tf4.55.4")
cli_cell = pytest.mark.skipif(not CLI_CELL, reason="the audit CLI is run in the notrl and trl0.22.1-tf4.55.4 cells")


def _cli(*args):
    env = dict(os.environ)
    env.pop("TRL_COMPAT_STRICT", None)  # strict mode is the patches'; --strict is the audit's own
    result = subprocess.run([sys.executable, "-m", "trl_compat", *args], capture_output=True, text=True, env=env)
    return result.returncode, result.stdout


@pytest.fixture(scope="module")
def audit_json():
    code, out = _cli("--audit", "--json")
    assert code == 0
    return json.loads(out)


@cli_cell
def test_text_and_json_name_the_same_bugs(audit_json):
    code, text = _cli("audit")
    assert code == 0
    for row in audit_json["bugs"]:
        assert f"  {row['id']}: {row['message']}" in text
    assert f"{len(audit_json['bugs'])}, {audit_json['unfixed']} not fixed here" in text


@cli_cell
def test_strict_exits_1_when_a_bug_is_not_fixed(audit_json):
    code, _ = _cli("audit", "--strict")
    assert code == (1 if audit_json["unfixed"] else 0)
    assert audit_json["unfixed"] == sum(r["action"] in ("advice", "not fixable here") for r in audit_json["bugs"])


@pytest.mark.skipif(TRL != Version("0.22.1"), reason=f"TRL {TRL}: the 0.22.1 cell's bugs")
def test_trl_0_22_1_scale_rewards_and_none_reward_baseline_fixed(audit_json):
    rows = {r["id"]: r for r in audit_json["bugs"]}
    assert rows["scale-rewards-swapped"]["action"] == "fixed"
    assert rows["scale-rewards-swapped"]["status"] == "applied"
    baseline = rows["none-reward-baseline"]  # the None-reward baseline (TRL #5902, fixed in 1.6.0): patched
    assert baseline["fixed_in"] == "1.6.0"
    assert baseline["action"] == "fixed" and baseline["status"] == "applied"
    code, text = _cli("--audit")
    assert "scale-rewards-swapped: " in text and "none-reward-baseline: " in text


def _trainer(tmp_path, options=None, **kwargs):
    pytest.importorskip("torch")
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    args, dropped = grpo_run.make_config(os.path.join(tmp_path, "out"), steps=1, **(options or {}))
    if set(dropped) & set(options or {}):
        pytest.skip(f"TRL {TRL}'s GRPOConfig has no {sorted(set(dropped) & set(options))}")
    return GRPOTrainer(
        model=tiny.save_tiny(os.path.join(tmp_path, "tiny-qwen2"), "qwen2"),
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(4),
        processing_class=tiny.make_tokenizer(),
        **kwargs,
    )


@pytest.fixture
def fresh_warnings(monkeypatch):
    from trl_compat.ledger import runtime

    monkeypatch.setattr(runtime, "_warned", set())


def _ledger_warnings(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "trl_compat" and "known TRL bug" in r.getMessage()]


def _logged_ids(caplog):
    return [m.split("known TRL bug ", 1)[1].split(" ", 1)[0] for m in _ledger_warnings(caplog)]


DORA_PATCH = "dora-magnitude-bf16"
DORA_WINDOW = TRL is not None and Version("0.26.0") <= TRL < Version("1.15.0")
needs_peft = pytest.mark.skipif(TRL is None or installed("peft") is None, reason="needs TRL and peft")


@needs_peft
@pytest.mark.parametrize("use_dora", [True, False], ids=["dora", "lora"])
def test_a_run_is_warned_of_the_unfixed_bugs_it_meets(tmp_path, caplog, fresh_warnings, unpatched, use_dora):
    from trl_compat.ledger import runtime

    from peft import LoraConfig

    config = LoraConfig(r=2, target_modules=["q_proj", "v_proj"], use_dora=use_dora)
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        _trainer(tmp_path, peft_config=config)
    # after the build: the patches of TRL's GRPO module have their statuses now
    expected = [r["id"] for r in runtime.warnings_for({"peft", "dora"} if use_dora else {"peft"})]
    assert _logged_ids(caplog) == expected
    assert DORA_PATCH not in expected  # fixed here where it applies
    if not (use_dora and DORA_WINDOW):
        return
    # the patch reverted: the same run meets the bug, unfixed
    runtime._warned.clear()
    caplog.clear()
    with unpatched(DORA_PATCH), caplog.at_level(logging.WARNING, logger="trl_compat"):
        _trainer(tmp_path / "unpatched", peft_config=config)
        expected = [r["id"] for r in runtime.warnings_for({"peft", "dora"})]
    assert DORA_PATCH in expected and _logged_ids(caplog) == expected
    [message] = [m for m in _ledger_warnings(caplog) if DORA_PATCH in m]
    assert "DoRA" in message and "use_dora" in message and "TRL 1.15.0" in message


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_a_run_without_the_trigger_is_not_warned(tmp_path, caplog, fresh_warnings):
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        _trainer(tmp_path)
    assert _ledger_warnings(caplog) == []


@pytest.mark.skipif(TRL is None, reason="needs TRL")
@engine_cells  # the warning's machinery; its outcomes differ by era: both bugs (0.22.1), one (1.0.0), none (newest)
def test_a_run_that_turns_on_paged_generation_is_warned(tmp_path, caplog, fresh_warnings):
    """An option the trainer's construction shows (``use_transformers_paged``): the run is warned of
    each unfixed bug behind it, and only where the ledger's window holds this TRL."""
    from trl_compat.ledger import runtime

    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        _trainer(tmp_path, options={"use_transformers_paged": True})
    expected = [r["id"] for r in runtime.warnings_for({"paged"})]
    assert _logged_ids(caplog) == expected
    paged = {r["id"] for r in runtime.warnings_for({"paged"}) if r["option"] == "use_transformers_paged"}
    # trl#4348 (0.20 - 0.24.x: continuous batching broken) and trl#5818 (0.20 - 1.4.x: inference tensors)
    assert paged == {bug for bug, fixed_in in (("trl#4348", "0.25.0"), ("trl#5818", "1.5.0")) if TRL < Version(fixed_in)}
    for message in _ledger_warnings(caplog):
        assert "use_transformers_paged" in message
