"""Two GRPO trainers in one process (a notebook, a test session) share none of the guard's state:
each has its own run with its step, its pending completions, S's seen generate calls and L's
decided batches and streak. Before the guard had a run per trainer, L's streak counted across
trainers (one trainer's batch over τ and the next trainer's first one made an alarm) and S's seen
calls were never cleared."""

from __future__ import annotations

import guard_runs

HAVE_TORCH = guard_runs.HAVE_TORCH

if HAVE_TORCH:
    import torch

    import grpo_run
    import tiny

SIZES = dict(per_device_train_batch_size=16, max_completion_length=32)  # L's minimum batch: 16 completions


def _over_tau_batch(run, call, step):
    """One batch of 8 completions whose D = k3(0.06) ~ 1.8e-3 is over τ (fp32, 1e-3) but under 10τ."""
    from trl_compat.guard.checks import logprobs
    from trl_compat.guard.testing import Sampled, Sampling

    rows = []
    for i in range(8):
        vllm = tuple([-2.0] * 32)
        rows.append(
            (Sampled(call, step, None, None, tuple(range(i, i + 32)), vllm, Sampling(temperature=1.0)), torch.full((32,), -1.94))
        )
    logprobs.compare(run, rows)
    logprobs.flush(run)


def test_two_trainers_in_one_process_share_no_guard_state(tmp_path, guard, monkeypatch):
    guard_runs.vllm_run_or_skip(lambda v: v >= (0, 15))  # L decides from TRL 0.15 (0.14 gives the guard no log-probs)
    from trl_compat.guard import testing
    from trl_compat.guard.checks import logprobs

    first = grpo_run.make_trainer(tmp_path / "a", use_vllm=True, steps=2, train_dataset=tiny.prompt_dataset(32), **SIZES)
    second = grpo_run.make_trainer(tmp_path / "b", use_vllm=True, steps=1, train_dataset=tiny.prompt_dataset(32), **SIZES)
    first.train()
    second.train()
    assert guard() == [], [a.line() for a in guard()]

    a, b = testing.known_run(first), testing.known_run(second)
    assert a is not None and b is not None and a is not b
    assert (a.step, b.step) == (2, 1)  # each run's step is its own trainer's
    assert len(testing.decided(first)) == 2 and len(testing.decided(second)) == 1  # L: one D per step, per run
    assert a.seen_calls and b.seen_calls and not (a.seen_calls & b.seen_calls)  # S: each run's own calls
    assert max(a.seen_calls) < min(b.seen_calls)  # the call numbers are the process's; the sets are the runs'
    assert a.generations >= 2 and b.generations >= 1
    assert a.pending is not b.pending

    # L's streak is per run: one batch over τ in each run is no alarm; a second one in the same run is
    fired = []
    monkeypatch.setattr(testing.LEDGER, "fire", fired.append)
    monkeypatch.setattr(logprobs, "precision", lambda engine, values: "fp32")
    monkeypatch.setattr(logprobs, "unavailable", lambda *args: None)
    _over_tau_batch(a, call=1001, step=7)
    _over_tau_batch(b, call=1002, step=3)
    assert fired == [] and (a.streak, b.streak) == (1, 1)  # one shared streak would have fired here
    _over_tau_batch(a, call=1003, step=8)
    assert [(f.check, f.step) for f in fired] == [("L", 8)] and (a.streak, b.streak) == (2, 1)
    assert a.figures.get("alarm") == [1.0] and "alarm" not in b.figures  # the alarm is counted in its run's metrics
