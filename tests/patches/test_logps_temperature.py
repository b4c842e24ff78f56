"""logps-temperature (opt-in): TRL < 0.16 samples at ``temperature`` but computes log-probs at 1.

* Status: in the window and switched off (the default, as in the matrix), "disabled" with a
  reason that names ``TRL_COMPAT_LOGPS_TEMPERATURE`` and says the bug is there; switched on,
  "applied"; from TRL 0.16.0 on (TRL divides by the temperature itself), "not needed".
* A real GRPO run at ``temperature=0.5`` (TRL 0.14.0 and 0.15.x cells): every log-prob forward TRL
  makes to the policy and the reference model is recorded (``logps_capture``) and the log-probs TRL
  computed are compared with ``log_softmax(logits / T)`` from an independent forward with the same
  ids and mask. Off (default): they are the temperature-1 values, not the T ones (the bug, and the
  proof that the default leaves training as TRL wrote it). On: they are the T ones.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat
from trl_compat.patches import logps_temperature as lt

from packaging.version import Version

from versions import installed

PID = "logps-temperature"
T = 0.5

TRL = installed("trl")

BUGGY = TRL is not None and TRL < Version("0.16.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} computes log-probs at the temperature (fixed in 0.16.0)")


@pytest.fixture
def switch(monkeypatch):
    """``switch(True)`` re-probes the patch with TRL_COMPAT_LOGPS_TEMPERATURE=1; undone afterwards."""
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    def set_to(on):
        if on:
            monkeypatch.setenv(lt.SWITCH, "1")
        else:
            monkeypatch.delenv(lt.SWITCH, raising=False)
        trl_compat.revert(PID)
        trl_compat.install(PID)
        return trl_compat.status(PID)

    yield set_to
    monkeypatch.delenv(lt.SWITCH, raising=False)
    trl_compat.revert(PID)
    trl_compat.install(PID)


@needs_trl
def test_status_off_by_default_and_on_with_the_switch(switch, caplog):
    with caplog.at_level("INFO", logger="trl_compat"):
        off = switch(False)
    reason = {r.id: r for r in trl_compat.report()}[PID].reason
    if not BUGGY:
        from trl.trainer import grpo_trainer

        assert off == trl_compat.NOT_NEEDED, reason
        assert switch(True) == trl_compat.NOT_NEEDED
        if TRL >= Version("0.21"):
            return  # the probe was written against TRL's code up to 0.20; the version gate decides beyond
        # the probe recognises the fixed code too (what decides for main-branch builds in the window)
        verdict = lt.probe(grpo_trainer)
        assert verdict.needed is False and "divides the logits by the sampling temperature" in verdict.reason
        return
    assert off == trl_compat.DISABLED  # the bug is there, the fix is switched off
    assert reason.startswith("opt-in, off:") and f"set {lt.SWITCH}=1" in reason, reason
    assert any(lt.SWITCH in rec.getMessage() and rec.levelname == "INFO" for rec in caplog.records)
    assert switch(True) == trl_compat.APPLIED
    status = {r.id: r for r in trl_compat.report()}[PID]
    assert "computes log-probs at temperature 1" in status.reason and "divides the logits" in status.reason
    method = "_get_per_token_logps" if TRL >= Version("0.15.0") else "compute_loss"
    assert status.target == f"trl.trainer.grpo_trainer.GRPOTrainer.{method}"


def _run(tmp_path):
    import grpo_run
    import logps_capture

    trainer = grpo_run.make_trainer(
        tmp_path, model="qwen2", steps=1, temperature=T, train_dataset=logps_capture.uneven_prompt_dataset()
    )
    assert trainer.args.temperature == T
    calls = logps_capture.LogpsCalls(trainer, pad_token_id=trainer.processing_class.pad_token_id, temperature=T)
    try:
        trainer.train()
    finally:
        calls.remove()
    assert {c.role for c in calls.calls} == {"policy", "ref"}, [c.role for c in calls.calls]
    return calls


@needs_bug
def test_default_off_log_probs_stay_at_temperature_1(tmp_path, switch):
    assert switch(False) == trl_compat.DISABLED
    calls = _run(tmp_path)
    for call in calls.calls:
        trl_logps = calls.trl_logps(call)
        torch.testing.assert_close(trl_logps, call.masked, atol=2e-5, rtol=1e-4)
        assert (trl_logps - call.masked_t).abs().max() > 0.05  # the bug: not the sampling distribution


@needs_bug
def test_switched_on_log_probs_are_at_the_sampling_temperature(tmp_path, switch):
    assert switch(True) == trl_compat.APPLIED
    calls = _run(tmp_path)
    for call in calls.calls:
        trl_logps = calls.trl_logps(call)
        torch.testing.assert_close(trl_logps, call.masked_t, atol=2e-5, rtol=1e-4)
        assert (trl_logps - call.masked).abs().max() > 0.05
        assert call.rows == call.k + 1  # logits-to-keep still delivers only the last K+1 logits
    # generate's forwards of the same module are left alone (sampling stays at T, not T squared)
    assert calls.others and calls.others_untouched()
