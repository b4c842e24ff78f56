"""Checks W1 (what each weight sync sent) and W2 (the weights vLLM holds at generate) of the
off-policy guard, in real tiny GRPO runs on the vLLM stand-in.

Positive controls, each with the patch that fixes the bug switched off:
* TRL 0.15.0 + LoRA, ``vllm-merged-weights``: vLLM gets the un-merged base weights -> W1 at step 1;
* TRL 0.28+ sleep mode, ``vllm-sleep-mode-weights``: vLLM reloads the checkpoint after every sync
  -> W2 at step 1, "initial/on-disk weights" (and C); TRL 0.26/0.27: at an unchanged step (the
  second evaluate()) -> W2 at that step;
* TRL 0.18/0.19 under FSDP2 (2 gloo processes, tests/support/guard_fsdp2_worker.py),
  ``fsdp2-vllm-sync``: no weight sent -> W1 at step 1 on both ranks;
* any cell: weights overwritten between the sync and generate -> W2 "corrupted", or restored to
  the sync before -> "one sync behind"; a vLLM storing every watched matrix transformed -> W2
  "unavailable", never a mismatch.
Negative controls: the same runs with the patches on, 0 alarms.
"""

from __future__ import annotations

import pytest

import guard_runs

HAVE_TORCH = guard_runs.HAVE_TORCH

if HAVE_TORCH:
    import torch

    import grpo_run
    import tiny


def _vllm_or_skip(versions=None, patch_id=None):
    return guard_runs.vllm_run_or_skip(versions, patch_id)


def _checks(alarms, *names):
    return [a for a in alarms if a.check in names]


def _engine_state(trainer):
    """The guard's record of the trainer's engine (held by its generate hook)."""
    from trl_compat.guard import testing

    return testing.engine_of(grpo_run.trainer_llm(trainer))


# -- W1: LoRA's merged weights lost (TRL 0.15.0) ---------------------------------------------------------


def test_unmerged_lora_sync_is_caught_by_W1_at_step_1(tmp_path, unpatched, guard):
    _vllm_or_skip(lambda v: v == (0, 15), "vllm-merged-weights")
    with unpatched("vllm-merged-weights"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, peft=True, steps=3)
        trainer.train()
    found = _checks(guard(), "W1")
    assert found, [a.line() for a in guard()]
    assert {a.step for a in found} == {1, 2}  # every sync after the adapter moved (step 0 syncs nothing in 0.15)
    first = found[0]
    assert first.fix == "vllm-merged-weights" and first.figures["kind"] == "unmerged"
    assert first.figures["sync_step"] == 1 and first.figures["frac"] >= 0.5, first.figures
    assert first.figures["tensor"].endswith(("o_proj.weight", "down_proj.weight"))
    assert not _checks(guard(), "W2")  # vLLM holds what was sent: the sync itself was wrong
    print("W1 unmerged:", [(a.step, a.figures["tensor"], a.figures["frac"], a.figures["max_abs_diff"]) for a in found])


def test_merged_lora_sync_no_alarm(tmp_path, guard):
    _vllm_or_skip(lambda v: v == (0, 15), "vllm-merged-weights")
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, peft=True, steps=3)
    trainer.train()
    assert guard() == []
    history = [h for h in trainer.state.log_history if "loss" in h]
    assert [h["offpolicy/weights_mismatch_frac"] for h in history] == [0.0, 0.0, 0.0]
    assert all(h["offpolicy/weights_sent"] > 0 for h in history[1:])
    engine = _engine_state(trainer)
    watches = engine.weights.watches
    assert len(watches) == 4 and all(w.verified for w in watches.values())
    # the adapter moved the merged weights vLLM holds away from the checkpoint
    assert all(not w.last.equal(w.checkpoint) for w in watches.values())


# -- W2: sleep mode reloads the checkpoint after the sync (TRL 0.25+) ---------------------------------------


def test_sleep_mode_reload_is_caught_by_W2_at_step_1(tmp_path, unpatched, guard):
    version = _vllm_or_skip(lambda v: v >= (0, 28), "vllm-sleep-mode-weights")
    with unpatched("vllm-sleep-mode-weights"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
        trainer.train()
    w2 = _checks(guard(), "W2")
    assert [a.step for a in w2] == [1, 2], [a.line() for a in guard()]
    assert all(a.figures["kind"] == "vLLM holds the initial/on-disk weights" for a in w2)
    assert w2[0].fix == "vllm-sleep-mode-weights" and w2[0].figures["frac"] > 0.5, w2[0].figures
    assert [a.step for a in _checks(guard(), "C")] == [1, 2]
    assert not _checks(guard(), "W1"), version  # what was sent was right
    print("W2 on-disk:", [(a.step, a.figures["tensor"], a.figures["frac"], a.figures["max_abs_diff"]) for a in w2])


def test_sleep_mode_reload_at_an_unchanged_step_is_caught_by_W2(tmp_path, unpatched, guard):
    """TRL 0.26/0.27: wake + reload, then a sync only at a new step: the second evaluate() at the
    same step generates from the checkpoint."""
    _vllm_or_skip(lambda v: (0, 26) <= v < (0, 28), "vllm-sleep-mode-weights")
    eval_dataset = tiny.prompt_dataset(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)
    with unpatched("vllm-sleep-mode-weights"):
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
        trainer.train()
        assert guard() == []  # every training generation follows a sync
        trainer.evaluate(eval_dataset=eval_dataset)
        trainer.evaluate(eval_dataset=eval_dataset)
    w2 = _checks(guard(), "W2")
    # every eval generation but the first (the one that follows the step's sync): >= 2 batches in 2 evaluate() calls
    assert {a.step for a in w2} == {3} and len(w2) >= 2, [a.line() for a in guard()]
    assert w2[0].figures["kind"] == "vLLM holds the initial/on-disk weights" and w2[0].figures["frac"] > 0.5, w2[0].figures
    print("W2 on-disk at an unchanged step:", w2[0].figures)


def test_sleep_mode_patched_no_alarm(tmp_path, guard):
    _vllm_or_skip(lambda v: v >= (0, 26), "vllm-sleep-mode-weights")
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3, vllm_enable_sleep_mode=True)
    trainer.train()
    eval_dataset = tiny.prompt_dataset(grpo_run.PER_DEVICE_TRAIN_BATCH_SIZE)
    trainer.evaluate(eval_dataset=eval_dataset)
    trainer.evaluate(eval_dataset=eval_dataset)
    assert guard() == []
    engine = _engine_state(trainer)
    assert all(w.verified and not w.last.equal(w.checkpoint) for w in engine.weights.watches.values())


# -- W2's classification: weights overwritten between the sync and generate -----------------------------------


def _tamper(trainer, how):
    """Before the guard sees vLLM's generate call: at step 1 remember vLLM's weights (those of the
    sync of step 1); at step 2, after the sync of step 2, overwrite them (``how``)."""
    llm = grpo_run.trainer_llm(trainer)
    guarded_generate = vars(llm)["generate"]
    saved = {}

    def generate(*args, **kwargs):
        step = trainer.state.global_step
        with torch.no_grad():
            for name, param in llm.model.named_parameters():
                if step == 1:
                    saved[name] = param.detach().clone()
                elif step == 2 and how == "previous":
                    param.copy_(saved[name])
                elif step == 2 and how == "corrupted":
                    noise = torch.randn(param.shape, generator=torch.Generator().manual_seed(0))
                    param.add_(noise.to(param.dtype))
        return guarded_generate(*args, **kwargs)

    llm.generate = generate


@pytest.mark.parametrize("how", ["corrupted", "previous"])
def test_weights_overwritten_after_the_sync_are_caught_by_W2(tmp_path, guard, how):
    _vllm_or_skip(lambda v: v != (0, 14))
    trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=3)
    _tamper(trainer, how)
    trainer.train()
    found = guard()
    assert [(a.check, a.step) for a in found] == [("W2", 2)], [a.line() for a in found]
    kind = found[0].figures["kind"]
    assert kind == ("vLLM is one sync behind" if how == "previous" else "vLLM's weights are corrupted"), kind
    assert found[0].fix is None and found[0].figures["frac"] > 0.5
    print(f"W2 {how}:", found[0].figures)


def test_no_tensor_verifiable_is_unavailable_not_mismatch(tmp_path, guard, caplog):
    _vllm_or_skip(lambda v: v != (0, 14))
    from trl_compat.guard.checks import weights

    original = weights.Watch.engine_values
    calls = {"n": 0}

    def transformed(self, param):  # vLLM "stores" every watched matrix transformed after the first sync
        calls["n"] += 1
        values = original(self, param)
        return values + 1 if getattr(self, "last", None) is not None or getattr(self, "sent", None) is not None else values

    weights.Watch.engine_values = transformed
    try:
        trainer = grpo_run.make_trainer(tmp_path, use_vllm=True, steps=2)
        with caplog.at_level("WARNING", logger="trl_compat.guard"):
            trainer.train()
    finally:
        weights.Watch.engine_values = original
    assert not _checks(guard(), "W2")
    assert calls["n"] > 0
    assert any("W2 unavailable" in r.getMessage() for r in caplog.records)
    engine = _engine_state(trainer)
    assert all(w.verified is False for w in engine.weights.watches.values())


def test_vllm_name():
    from trl_compat.guard.checks.weights import vllm_name

    assert vllm_name("base_model.model.model.layers.0.self_attn.o_proj.base_layer.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert vllm_name("_orig_mod.model.layers.1.mlp.down_proj.weight") == "model.layers.1.mlp.down_proj.weight"
    assert vllm_name("model.norm.weight") == "model.norm.weight"


# -- W1: FSDP2 sends nothing (TRL 0.18/0.19), 2 real processes -------------------------------------------------


def _fsdp2_or_skip():
    from packaging.version import Version

    from versions import installed

    trl, torch_version, vllm = installed("trl"), installed("torch"), installed("vllm")
    if not (trl is not None and Version("0.18.0") <= trl < Version("0.20.0") and vllm and torch_version >= Version("2.6.0")):
        pytest.skip("needs trl 0.18/0.19 (fsdp2-vllm-sync's first window), vllm and torch >= 2.6")


def _launch_fsdp2(tmp_path, monkeypatch, disable=""):
    from workers import launch_two

    monkeypatch.setenv("TRL_COMPAT_GUARD", "1")
    model_dir = tiny.save_tiny(tmp_path / "tiny_qwen2", "qwen2")
    run = launch_two("guard_fsdp2_worker.py", model_dir, tmp_path / "out", marker="G2|", disable=disable, timeout=480)
    assert run.returncode == 0, run.tail()
    run.per_rank("done")
    return run


def test_fsdp2_sync_sending_nothing_is_caught_by_W1_at_step_1(tmp_path, monkeypatch):
    _fsdp2_or_skip()
    run = _launch_fsdp2(tmp_path, monkeypatch, disable="fsdp2-vllm-sync")
    for report in run.per_rank("guard"):
        assert report["synced_names"] == 0, report  # TRL's FSDP1-only walk sent nothing
        found = [(a["check"], a["step"]) for a in report["alarms"]]
        assert ("W1", 1) in found and ("W1", 2) in found, report["alarms"]
        w1 = [a for a in report["alarms"] if a["check"] == "W1"]
        assert all(a["fix"] == "fsdp2-vllm-sync" and a["figures"]["sent"] == 0 for a in w1), w1
        assert not [a for a in report["alarms"] if a["check"] == "W2"], report["alarms"]  # vLLM holds what it has
        print("FSDP2 W1:", report["rank"], [a["line"] for a in w1][:1])


def test_fsdp2_patched_sync_no_alarm(tmp_path, monkeypatch):
    _fsdp2_or_skip()
    run = _launch_fsdp2(tmp_path, monkeypatch)
    for report in run.per_rank("guard"):
        assert report["synced_names"] > 0, report
        assert report["alarms"] == [], report["alarms"]
        assert report["stats"]["generations"] == 3, report
        sent = report["figures"]["weights_sent"]  # W1's count per sync: every parameter, one load_weights call each
        assert len(sent) == 3 and len(set(sent)) == 1 and sent[0] > 0, report["figures"]
        assert report["figures"]["weights_mismatch_frac"] == [0.0, 0.0, 0.0], report["figures"]  # W2 verified each generate
