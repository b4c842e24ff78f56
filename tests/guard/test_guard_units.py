"""The guard's parts that need no TRL, torch or vLLM: its switch, its report, check C's state
machine on a recorded call sequence, P's diagnosis, the completion store, the metrics."""

from __future__ import annotations

import json
import subprocess
import sys

from trl_compat._engine import settings
from trl_compat.guard import testing
from trl_compat.guard.checks import engine_calls, prompts
from trl_compat.guard.testing import LEDGER, Alarm, EngineRecord, Pending, Sampled, Sampling

import pytest


@pytest.fixture(autouse=True)
def _alarms_fired_here_are_not_the_cells():
    """These tests fire alarms on purpose, outside any run: they leave the process's ledger as they
    found it, so the cell's guard counts (tests/conftest.py) hold only what GRPO runs raised."""
    before = len(LEDGER.alarms)
    yield
    del LEDGER.alarms[before:]


@pytest.mark.parametrize(
    "value, mode",
    [("1", "on"), (" On ", "on"), ("strict", "strict"), ("STRICT", "strict"), ("0", "off"), ("", "off"), ("enabled", "off")],
)
def test_the_switch(value, mode):
    assert settings.guard_mode({"TRL_COMPAT_GUARD": value}) == mode
    problem = settings.guard_problem({"TRL_COMPAT_GUARD": value})
    assert (problem is not None) == (value == "enabled")
    if problem:
        assert "assumed off" in problem and "strict" in problem


def test_report_names_the_mode_and_every_check():
    env = {"TRL_COMPAT_GUARD": "strict", "PATH": ""}
    out = subprocess.run([sys.executable, "-m", "trl_compat", "--json"], capture_output=True, text=True, check=True, env=env)
    guard = json.loads(out.stdout)["guard"]
    assert guard["mode"] == "strict"
    assert list(guard["checks"]) == ["P", "S", "C", "W1", "W2", "L"]


def _engine(prefix_caching=True):
    return EngineRecord(None, prefix_caching=prefix_caching)


def _alarms_after(calls):
    before = len(LEDGER.alarms)
    engine = _engine()
    for call in calls:
        call(engine)
    return LEDGER.alarms[before:]


sync = lambda step: lambda e: engine_calls.synced(e, step)  # noqa: E731
generate = lambda e: engine_calls.before_generate(e, None)  # noqa: E731
reset = lambda e: engine_calls.reset_prefix_cache(e, (), {})  # noqa: E731
reload = lambda e: engine_calls.collective_rpc(e, ("reload_weights",), {})  # noqa: E731
sleep = lambda level: lambda e: engine_calls.sleep(e, (), {"level": level})  # noqa: E731
wake = lambda e: engine_calls.wake_up(e, (), {"tags": ["weights"]})  # noqa: E731


@pytest.mark.parametrize(
    "calls, fired",
    [
        # TRL 0.16+: sync, reset, generate: healthy
        ([generate, sync(1), reset, generate, sync(2), reset, generate], []),
        # TRL 0.15's prefix cache: never reset
        ([generate, sync(1), generate, sync(2), generate], ["prefix", "prefix"]),
        # the first sync sends the checkpoint's weights: nothing can be stale yet
        ([generate, sync(0), generate], []),
        # TRL 0.28+ sleep mode (#5312): sync, then wake + reload from disk, then generate
        ([sync(0), generate, sleep(1), sync(1), reset, wake, reload, generate], ["reload"]),
        # TRL 0.26 - 0.27: wake + reload before the sync: healthy
        ([generate, sleep(1), wake, reload, sync(1), reset, generate], []),
        # sleep level 2 discards the weights; a sync after waking restores them
        ([sync(1), reset, sleep(2), wake, generate], ["discarded"]),
        ([sync(1), reset, sleep(2), wake, sync(1), reset, generate], []),
        # a sync into a sleeping engine is undone by wake_up (#5142)
        ([generate, sleep(1), sync(1), wake, reset, generate], ["lost"]),
    ],
)
def test_engine_call_order(calls, fired):
    found = _alarms_after(calls)
    assert [a.check for a in found] == ["C"] * len(fired)
    words = {"prefix": "prefix cache", "reload": "reloaded", "discarded": "discarded", "lost": "sleeping engine"}
    for alarm, kind in zip(found, fired):
        assert words[kind] in alarm.what


class _Tok:
    bos_token_id = 1


@pytest.mark.parametrize(
    "engine, loss, fix",
    [
        ([1, 1, 5, 6], [1, 5, 6], "vllm-double-bos"),
        ([9, 8, 5, 6, 7], [5, 6, 7], "vllm-prompt-truncation"),
        ([5, 7], [5, 3, 7], "vllm-prompt-special-tokens"),
        ([5, 6, 7], [5, 6, 8], None),
    ],
)
def test_prompt_diagnosis(engine, loss, fix):
    assert prompts.likely_cause(engine, loss, _Tok())[1] == fix


def _sampled(prompt, completion, call=1):
    return Sampled(
        call=call,
        step=0,
        prompt_ids=tuple(prompt),
        prompt_text=None,
        completion_ids=tuple(completion),
        logprobs=None,
        sampling=Sampling(1.0),
    )


def test_store_keeps_the_newest_of_a_prompt_and_drops_ambiguous_completions():
    store = Pending(limit=3)
    store.add(_sampled([1], [7, 8], call=1))
    store.add(_sampled([1], [7, 8], call=2))
    assert store.find((7, 8)).call == 2
    store.add(_sampled([2], [7, 8], call=3))  # the same completion of another prompt: which row is whose?
    assert store.find((7, 8)) is None
    for n in range(3):
        store.add(_sampled([1], [n]))
    assert store.find((0,)) is not None and store.find((7, 8)) is None  # the oldest left first


def test_metrics_sum_counts_and_say_whether_any_alarm():
    values = testing.metrics({"alarm": [1.0, 1.0], "rows_checked": [4, 4], "kl_k3_median": [1e-4, 3e-4]})
    assert values["offpolicy/alarm"] == 1.0 and values["offpolicy/rows_checked"] == 8.0
    assert values["offpolicy/kl_k3_median"] == pytest.approx(2e-4)
    assert testing.metrics({})["offpolicy/alarm"] == 0.0


def test_an_alarm_line_names_check_figures_cause_and_fix():
    line = Alarm("P", "3 of 8 rows differ", "truncated for the loss only", fix="vllm-prompt-truncation", step=4, rank=1).line()
    assert line.startswith("off-policy check P (prompt ids vLLM generated from == the loss's prompt ids) failed at step 4, rank 1")
    assert "3 of 8 rows differ; likely cause: truncated for the loss only" in line
    assert "fixed by trl_compat's `vllm-prompt-truncation` patch" in line


def test_a_reload_that_loaded_nothing_keeps_the_synced_weights():
    """trl_compat's vllm-sleep-mode-weights makes TRL's reload after a sync a no-op: with the engine's
    model in reach, only a reload that went through load_weights counts."""
    before = len(LEDGER.alarms)
    engine = _engine()
    engine.model = object()
    engine_calls.synced(engine, 1)
    engine_calls.collective_rpc(engine, ("reload_weights",), {}, False)
    engine_calls.before_generate(engine, None)
    assert LEDGER.alarms[before:] == []
    engine_calls.collective_rpc(engine, ("reload_weights",), {}, True)
    engine_calls.before_generate(engine, None)
    assert [a.check for a in LEDGER.alarms[before:]] == ["C"]


def test_alarms_inside_observing_are_never_raised_later():
    from trl_compat import guard

    previous = guard.mode()
    guard.enable(strict=True)
    try:
        LEDGER.take_unraised()
        with guard.observing():
            LEDGER.fire(Alarm("S", "x", "y"))
        assert LEDGER.take_unraised() == []
        LEDGER.fire(Alarm("S", "x", "y"))
        assert [a.check for a in LEDGER.take_unraised()] == ["S"]
    finally:
        if previous == "off":
            guard.disable()
        else:
            guard.enable(strict=previous == "strict")
