"""trl_compat._engine.reporting and the CLI: what the engine tells about each patch."""

import importlib
import logging

import trl_compat
from trl_compat import __main__ as cli
from trl_compat import _engine as engine

import pytest

from cells import engine_cells


def _prefixing(original):
    def wrapper(*args, **kwargs):
        return ("wrapped",) + original(*args, **kwargs)

    return wrapper


def test_summary_line_once_settled(fake_pkg, caplog, make_patch):
    patch = make_patch(fake_pkg)
    with caplog.at_level(logging.INFO, logger="trl_compat"):
        trl_compat.install(patch.id)
        importlib.import_module(fake_pkg)
    summaries = [r for r in caplog.records if r.levelno == logging.INFO and "applied" in r.getMessage()]
    if any(s.status == trl_compat.PENDING for s in trl_compat.report()):
        pytest.skip("other patches still wait for their modules in this cell")
    assert len(summaries) == 1 and patch.id in summaries[0].getMessage()


def test_a_class_replaced_after_patching_is_reported(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)
    mod.Trainer = type("UnslothTrainer", (mod.Base,), {"__module__": "unsloth_compiled_cache.UnslothTrainer"})
    reason = {r.id: r.reason for r in trl_compat.report()}[patch.id]
    assert "has since been replaced by unsloth_compiled_cache.UnslothTrainer" in reason


def test_a_user_subclass_overriding_the_target_is_reported(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    trl_compat.install(patch.id)

    class MyTrainer(mod.Trainer):
        def step(self, x):
            return ("mine", x)

    reason = {r.id: r.reason for r in trl_compat.report()}[patch.id]
    assert "MyTrainer" in reason and "super()" in reason


def test_report_target_is_what_was_changed(fake_pkg, make_patch):
    importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, target="Trainer", changes=("Trainer.step",), apply=lambda m, p: p.wrap(m.Trainer, "step", _prefixing))
    trl_compat.install(patch.id)
    assert {r.id: r.target for r in trl_compat.report()}[patch.id] == f"{fake_pkg}.Trainer.step"


def test_status_and_applied_follow_the_report(fake_pkg, make_patch):
    importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg)
    assert patch.id not in trl_compat.applied()
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED and patch.id in trl_compat.applied()
    assert {r.id: r.status for r in trl_compat.report()}[patch.id] == trl_compat.APPLIED


@engine_cells
def test_cli_json_and_table(fresh_cli):
    data, table = fresh_cli
    stack = {"python", "torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "vllm"}
    assert set(data["versions"]) >= stack
    assert [p["id"] for p in data["patches"]] == [p.id for p in engine.registry() if not p.id.startswith("test-")]
    for rec in data["patches"]:
        assert rec["status"] != trl_compat.PENDING, rec  # the CLI imports trigger modules
        assert rec["reason"]
    assert "patch" in table and "status" in table
    # trl_compat's own version first, so that a pasted report says which trl_compat
    assert list(data)[0] == "trl_compat" and data["trl_compat"] == trl_compat.__version__
    assert data["headline"].startswith(f"trl_compat {trl_compat.__version__}")
    assert table.strip().splitlines()[0] == data["headline"], table
    for rec in data["patches"]:
        assert rec["id"] in table


@engine_cells
def test_cli_counts_line_and_applied_rows_first(fresh_cli):
    data, table = fresh_cli
    statuses = [rec["status"] for rec in data["patches"]]
    assert list(data["counts"])[:4] == ["applied", "not needed", "disabled", "undecided"]
    assert sum(data["counts"].values()) == len(statuses)
    for status, n in data["counts"].items():
        assert statuses.count(status) == n, (status, n)
    lines = table.strip().splitlines()
    assert lines[1] == "patches: " + ", ".join(f"{n} {s}" for s, n in data["counts"].items() if n or s in cli.COUNTED)
    shown = [line.split()[0] for line in lines if line.startswith("  ") and line.split()[0] in {r["id"] for r in data["patches"]}]
    ranks = [cli.ROW_ORDER.index({r["id"]: r["status"] for r in data["patches"]}[pid]) for pid in shown]
    assert ranks == sorted(ranks), shown  # applied rows first, "not needed" last


def test_the_training_line_tells_fixes_that_change_numbers_from_crash_fixes_and_the_guard(monkeypatch):
    from trl_compat._helpers import training_log

    assert training_log.changes_numbers("scale-rewards-swapped")  # moves a 0.22.1 run's loss
    assert training_log.changes_numbers("vllm-prefix-cache")
    assert not training_log.changes_numbers("pad-token")  # only prevents a crash
    assert not training_log.changes_numbers("eval-before-train-ga")
    monkeypatch.delenv("TRL_COMPAT_GUARD", raising=False)
    assert training_log.guard_part(uses_vllm=True) == "off-policy guard: off"
    monkeypatch.setenv("TRL_COMPAT_GUARD", "strict")
    assert training_log.guard_part(uses_vllm=True) == "off-policy guard: strict"
    assert training_log.guard_part(uses_vllm=False) == "off-policy guard: strict, nothing to check (this run uses no vLLM)"
    monkeypatch.setenv("TRL_COMPAT_GUARD", "1")
    assert training_log.guard_part(uses_vllm=False) == "off-policy guard: on, nothing to check (this run uses no vLLM)"
