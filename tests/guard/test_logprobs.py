"""Check L of the off-policy guard (vLLM's log-probs of the sampled tokens vs the trainer's), in real
tiny GRPO runs on the vLLM stand-in, whose log-probs come from its own forward pass (raw, or
processed as ``logprobs_mode="processed_logprobs"`` asks).

Batches are sized for L's minimum (8 completions, 256 tokens): 16 completions of up to 32 tokens.

* healthy runs, patches on: 0 alarms, D decided every step and printed (float32 vs float32 on
  0.15: D ~ 0);
* gross mismatch, vLLM serving another checkpoint than the trainer's (TRL 0.15 syncs nothing at
  step 0, and W2 cannot see it: the engine holds what it loaded): L at step 0, D > 10τ;
* vLLM's weights overwritten with noise after the sync: L (and W2) at that step;
* the gate, TRL 0.23.1 at temperature 0.7: with ``vllm-is-raw-logprobs`` off vLLM returns raw
  (T = 1) log-probs, L says "unavailable" and compares nothing (without the gate, at T = 0.3, it fires at step 1);
  with the patch on (processed log-probs at T = 0.7) it compares, D ~ 0.
"""

from __future__ import annotations

import pytest

import guard_runs

HAVE_TORCH = guard_runs.HAVE_TORCH

if HAVE_TORCH:
    import torch

    import grpo_run
    import tiny

SIZES = dict(per_device_train_batch_size=16, max_completion_length=32)


def _vllm_or_skip(versions=None, patch_id=None):
    # TRL 0.14's log-prob function is nested in compute_loss: the guard gets no log-prob values there
    return guard_runs.vllm_run_or_skip(lambda v: v >= (0, 15) and (versions is None or versions(v)), patch_id)


def _l(alarms):
    return [a for a in alarms if a.check == "L"]


def _decided(trainer):
    from trl_compat.guard import testing

    return testing.decided(trainer)


def _dataset():
    return tiny.prompt_dataset(32)


def test_healthy_run_decides_D_every_step_no_alarm(tmp_path, guard):
    _vllm_or_skip()
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, train_dataset=_dataset(), **SIZES)
    trainer.train()
    assert guard() == [], [a.line() for a in guard()]
    d = _decided(trainer)
    assert len(d) == 3, d
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert all(h["offpolicy/tokens"] >= 256 for h in history), history
    assert all(h["offpolicy/kl_k3_median"] < 1e-4 for h in history), history
    print("healthy D:", d, "mean |diff|:", [h["offpolicy/logp_abs_diff_mean"] for h in history])


def test_vllm_serving_another_checkpoint_is_caught_by_L_at_step_0(tmp_path, guard):
    _vllm_or_skip(lambda v: v < (0, 16))  # 0.18+ syncs at step 0, which repairs it before any generation
    other = str(tiny.save_tiny(tmp_path / "other", "qwen2", model=tiny.make_model("qwen2", seed=1)))
    model = tiny.make_model("qwen2", seed=0)
    model.config._name_or_path = model.name_or_path = other  # vLLM loads the other checkpoint; the trainer trains seed 0
    trainer = grpo_run.make_trainer(tmp_path, model=model, use_vllm=True, steps=2, train_dataset=_dataset(), **SIZES)
    trainer.train()
    found = _l(guard())
    assert [a.step for a in found] == [0], [a.line() for a in guard()]
    figures = found[0].figures
    assert figures["precision"] == "fp32" and figures["D"] > 10 * figures["tau"] and figures["generated_at"] == 0
    assert "not staleness" in found[0].cause
    assert not [a for a in guard() if a.check in ("W2", "C")]  # the engine holds what it loaded
    d = _decided(trainer)
    assert d[1] < 1e-4 < d[0], d  # after the sync of step 1, vLLM holds the trainer's weights
    print("another checkpoint D:", d, figures)


def test_noise_in_vllm_weights_is_caught_by_L(tmp_path, guard):
    _vllm_or_skip()
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, train_dataset=_dataset(), **SIZES)
    llm = grpo_run.trainer_llm(trainer)
    guarded_generate = vars(llm)["generate"]

    def generate(*args, **kwargs):
        if trainer.state.global_step == 1:
            with torch.no_grad():
                for param in llm.model.parameters():
                    param.add_(0.5 * torch.randn(param.shape, generator=torch.Generator().manual_seed(0)).to(param.dtype))
                llm.model.weights_version += 1  # the stand-in generates with the new values
        return guarded_generate(*args, **kwargs)

    llm.generate = generate
    trainer.train()
    found = _l(guard())
    assert [a.step for a in found] == [1], [a.line() for a in guard()]
    assert found[0].figures["D"] > 10 * found[0].figures["tau"]
    assert [a.step for a in guard() if a.check == "W2"] == [1]
    d = _decided(trainer)
    assert d[0] < found[0].figures["tau"] and d[2] < found[0].figures["tau"], d  # step 2's sync repairs it
    print("noise D:", d, found[0].figures)


def test_raw_logprobs_at_temperature_below_1_are_not_compared(tmp_path, unpatched, guard, monkeypatch):
    _vllm_or_skip(lambda v: v == (0, 23), "vllm-is-raw-logprobs")
    from trl_compat.guard.checks import logprobs

    reasons = []
    gate = logprobs.unavailable

    def spy(*args):
        reasons.append(gate(*args))
        return reasons[-1]

    monkeypatch.setattr(logprobs, "unavailable", spy)
    with unpatched("vllm-is-raw-logprobs"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_dataset(), temperature=0.7, **SIZES)
        trainer.train()
    assert _l(guard()) == [] and _decided(trainer) == []
    assert len(reasons) == 32 and set(reasons) == {
        "vLLM returns raw (temperature 1) log-probs and the loss computes them at temperature 0.7"
    }, set(reasons)


def test_raw_logprobs_at_low_temperature_would_alarm_without_the_gate(tmp_path, unpatched, guard, monkeypatch):
    _vllm_or_skip(lambda v: v == (0, 23), "vllm-is-raw-logprobs")
    from trl_compat.guard.checks import logprobs

    monkeypatch.setattr(logprobs, "unavailable", lambda *a: None)  # the gate removed
    with unpatched("vllm-is-raw-logprobs"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_dataset(), temperature=0.3, **SIZES)
        trainer.train()
    d = _decided(trainer)
    found = _l(guard())
    # vLLM runs in float16 here ("auto" on a float32 checkpoint): τ = 0.05, over it on 2 batches in a row
    assert len(d) == 2 and min(d) > 0.05, d
    assert [a.step for a in found] == [1] and found[0].figures["precision"] == "16-bit", [a.line() for a in guard()]
    # the guard's alignment of the two log-prob arrays is TRL's own: the same mean |Δ| (no token clipped here)
    history = [h for h in trainer.state.log_history if "loss" in h]
    for h in history:
        assert abs(h["offpolicy/logp_abs_diff_mean"] - h["sampling/sampling_logp_difference/mean"]) < 1e-5, h
    print("raw vs T=0.3, ungated D:", d)


def test_processed_logprobs_at_temperature_below_1_are_compared(tmp_path, guard):
    _vllm_or_skip(lambda v: v == (0, 23), "vllm-is-raw-logprobs")
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2, train_dataset=_dataset(), temperature=0.7, **SIZES)
    trainer.train()
    assert guard() == []
    d = _decided(trainer)
    assert len(d) == 2 and max(d) < 1e-4, d
    print("processed T=0.7 D:", d)


def test_statistic_and_firing_rules(monkeypatch):
    """The rules on made-up batches: median of per-completion k3, 10τ once, τ on two consecutive batches."""
    if not HAVE_TORCH:
        pytest.skip("needs torch")
    from trl_compat.guard import testing
    from trl_compat.guard.checks import logprobs
    from trl_compat.guard.testing import Sampled, Sampling

    run = testing.new_run()
    fired = []
    monkeypatch.setattr(testing.LEDGER, "fire", fired.append)
    monkeypatch.setattr(logprobs, "precision", lambda engine, values: "fp32")
    monkeypatch.setattr(logprobs, "loss_temperature", lambda run: 1.0)
    monkeypatch.setattr(logprobs, "unavailable", lambda *a: None)

    def batch(call, shift, n=8, length=32):
        rows = []
        for i in range(n):
            vllm = tuple([-2.0] * length)
            sampled = Sampled(call, call, None, None, tuple(range(i, i + length)), vllm, Sampling(temperature=1.0))
            rows.append((sampled, torch.full((length,), -2.0 + shift)))
        logprobs.compare(run, rows)
        logprobs.flush(run)

    k3 = lambda x: float(torch.tensor(x).exp() - x - 1)  # noqa: E731
    batch(1, 0.0)
    batch(2, 0.06)  # k3 ~ 1.8e-3 > τ once: nothing
    assert fired == []
    batch(3, 0.06)  # twice in a row: alarm
    assert len(fired) == 1 and abs(fired[0].figures["D"] - k3(0.06)) < 1e-6
    batch(4, 0.0)
    batch(5, 0.2)  # k3 ~ 0.0214 > 10τ once: alarm
    assert len(fired) == 2
    batch(6, 1.0, n=7)  # too few completions: no decision
    batch(7, 1.0, length=16)  # 8 x 16 = 128 tokens: too few
    assert len(fired) == 2 and len(run.decided) == 5
    assert [a.step for a in fired] == [3, 5]  # each alarm carries its batch's step


@pytest.mark.parametrize(
    "version, mode, vllm_t, loss_t, sampling, compared",
    [
        ((0, 10, 2), "processed_logprobs", 0.7, 0.7, {}, True),
        ((0, 10, 2), "processed_logprobs", 0.7, 1.0, {}, False),  # S's alarm; L does not compare
        ((0, 10, 1, 1), "processed_logprobs", 0.7, 0.7, {}, False),  # taken before the temperature
        ((0, 10, 1, 1), "processed_logprobs", 1.0, 1.0, {}, True),
        ((0, 10, 2), "raw_logprobs", 0.7, 0.7, {}, False),
        ((0, 10, 2), "raw_logprobs", 0.7, 1.0, {}, True),  # raw values are the T=1 policy's
        ((0, 10, 2), "processed_logprobs", 1.0, 1.0, {"top_p": 0.9}, False),
        ((0, 10, 2), "raw_logprobs", 1.0, 1.0, {"penalties": ("repetition_penalty=1.1",)}, False),
        ((0, 10, 2), "processed_logprobs", 0.0, 1.0, {}, False),  # greedy
        ((0, 10, 2), None, 1.0, 1.0, {}, False),  # unknown domain (a server)
    ],
)
def test_the_gate(monkeypatch, version, mode, vllm_t, loss_t, sampling, compared):
    from types import SimpleNamespace

    from trl_compat._helpers import vllm_logprobs
    from trl_compat.guard.checks import logprobs_gate as logprobs
    from trl_compat.guard.testing import Sampled, Sampling

    monkeypatch.setattr(vllm_logprobs, "vllm_version", lambda: version)
    logprobs._processed_without_temperature.cache_clear()  # read once per process otherwise
    engine = SimpleNamespace(logprobs_mode=mode) if mode else None
    sampled = Sampled(1, 0, None, None, (1, 2), (-1.0, -1.0), Sampling(temperature=vllm_t, **sampling), engine=engine)
    reason = logprobs.unavailable(sampled, loss_t, False)  # no dropout
    logprobs._processed_without_temperature.cache_clear()
    assert (reason is None) == compared, reason
