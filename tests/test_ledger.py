"""The upstream ledger (trl_compat/ledger/grpo.tsv) is complete and agrees with the registry, and
tools/update_ledger.py appends what a TRL git directory has that the ledger lacks (stack-free).

What fails here: a record left ``open``; a ``patched:``/``advice:`` id the registry lacks (a renamed
patch); a registry id no record names; a record removed or added without rewriting the header's
counts (``python tools/update_ledger.py --header``); a malformed field."""

import importlib.util
import os
import subprocess
import sys

from trl_compat import ledger
from trl_compat.patches import PATCHES

import pytest
from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORDS = ledger.read_records()
REGISTRY_IDS = {p.id for p in PATCHES}
ANSWERS_A_VERDICT = ("patched", "advice", "not-reachable", "opt-in")


def _tool():
    spec = importlib.util.spec_from_file_location("update_ledger", os.path.join(ROOT, "tools", "update_ledger.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_ledger_covers_v0_14_to_1_16():
    commits = [r for r in RECORDS if ".." not in r["change"]]
    pairs = {r["change"].split(":", 1)[0] for r in RECORDS if ".." in r["change"]}
    assert len(commits) >= 640
    assert {r["first_release"] for r in commits} >= {"0.15.0", "0.29.1", "1.0.0", "1.9.0"}
    assert "1.15.0..1.16.0" in pairs and "1.9.0..1.9.1" in pairs


def test_no_record_is_open():
    open_records = [r["change"] for r in RECORDS if ledger.verdict_kind(r["verdict"]) == "open"]
    assert open_records == [], f"{len(open_records)} record(s) still to triage: {open_records[:10]}"


def test_every_named_id_is_in_the_registry():
    named = {i for r in RECORDS for i in ledger.verdict_ids(r["verdict"])}
    assert sorted(named - REGISTRY_IDS) == []


def test_every_registry_id_is_named_by_a_record():
    named = {i for r in RECORDS for i in ledger.verdict_ids(r["verdict"])}
    assert sorted(REGISTRY_IDS - named) == []


def test_the_header_counts_the_records():
    with open(ledger.LEDGER_PATH, encoding="utf-8") as lines:
        header = [line.rstrip("\n") for line in lines if line.startswith("#")]
    assert header == ledger.header_lines(RECORDS), "records added or removed: run python tools/update_ledger.py --header"


def record_problems(record):
    """What is wrong with one record's fields ([] when nothing)."""
    problems = []
    kind = ledger.verdict_kind(record["verdict"])
    if kind not in ledger.VERDICT_KINDS:
        return [f"verdict {record['verdict']!r}"]
    if not record["title"]:
        problems.append("no title")
    if kind in ("patched", "advice") and not ledger.verdict_ids(record["verdict"]):
        problems.append("names no id")
    if kind in ("not-reachable", "opt-in") and not ledger.verdict_value(record["verdict"]):
        problems.append("says not why / which option")
    if kind == "upstream-open":
        # no release has the fix: no first_release, the release that brought the bug, the issue it is read from
        if record["first_release"] or not record["since"] or not record["reason"]:
            problems.append("upstream-open: needs since and a reason, no first_release")
        Version(record["since"] or "0")
        if record["change"] != f"open:{record['pr']}" or not record["pr"].isdigit():
            problems.append("upstream-open: change must be open:<its issue or PR number>")
        return problems + [f"condition {c!r}" for c in filter(None, record["when"].split(",")) if c not in ledger.CONDITIONS]
    if kind in ANSWERS_A_VERDICT:
        if not record["reason"]:
            problems.append("no reason")
        if not record["since"] or Version(record["since"]) > Version(record["first_release"]):
            problems.append(f"since {record['since']!r} not at or before {record['first_release']}")
    else:
        Version(record["first_release"])
    problems += [f"condition {c!r}" for c in filter(None, record["when"].split(",")) if c not in ledger.CONDITIONS]
    if ".." not in record["change"] and not (len(record["change"]) == 9 and set(record["change"]) <= set("0123456789abcdef")):
        problems.append("not a 9-digit commit hash")
    return problems


def test_record_fields():
    bad = {r["change"]: p for r in RECORDS for p in [record_problems(r)] if p}
    assert bad == {}


def test_record_checks_can_fail():
    good = next(r for r in RECORDS if ledger.verdict_kind(r["verdict"]) == "opt-in")
    assert record_problems(good) == []
    assert record_problems(dict(good, reason="")) == ["no reason"]
    assert record_problems(dict(good, when="moon")) == ["condition 'moon'"]
    assert record_problems(dict(good, verdict="opt-in")) == ["says not why / which option"]


def test_upstream_open_records_match_open_registry_windows():
    """An ``upstream-open:<id>`` record names an entry no release has fixed (``fixed_in={}``, TRL's window open
    at the top), and every such entry whose window is open is named by one: the ledger and README's
    "not fixed upstream" say the same."""
    from trl_compat.patches import PATCHES

    named = {i for r in RECORDS if ledger.verdict_kind(r["verdict"]) == "upstream-open" for i in ledger.verdict_ids(r["verdict"])}
    open_entries = {p.id for p in PATCHES if p.fixed_in == {} and "<" not in p.requires.get("trl", "<")}
    assert named == open_entries


def test_upstream_open_checks_can_fail():
    good = next(r for r in RECORDS if ledger.verdict_kind(r["verdict"]) == "upstream-open")
    assert record_problems(good) == []
    assert record_problems(dict(good, first_release="1.16.0")) == ["upstream-open: needs since and a reason, no first_release"]
    assert record_problems(dict(good, change="e086f073c")) == ["upstream-open: change must be open:<its issue or PR number>"]


def test_records_are_unique():
    changes = [r["change"] for r in RECORDS]
    assert len(changes) == len(set(changes))


def _git(repo, *args, env=None):
    subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, env=env)


@pytest.fixture
def trl_history(tmp_path):
    """A TRL-like git history: v0.14.0, a GRPO commit released in v0.15.0, a docs commit, a GRPO commit on main."""
    repo = str(tmp_path / "trl")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    subprocess.run(["git", "init", "-q", "-b", "main", repo], check=True, env=env)

    def commit(path, subject):
        full = os.path.join(repo, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "a") as out:
            out.write(subject + "\n")
        _git(repo, "add", path, env=env)
        _git(repo, "commit", "-q", "-m", subject, env=env)

    commit("trl/trainer/grpo_trainer.py", "GRPO (#1)")
    _git(repo, "tag", "v0.14.0", env=env)
    commit("trl/trainer/grpo_trainer.py", "Fix the baseline (#12)")
    commit("docs/index.md", "Docs (#13)")
    _git(repo, "tag", "v0.15.0", env=env)
    commit("trl/generation/vllm_client.py", "Fix the client (#14)")
    commit("trl/__init__.py", '__version__ = "0.16.0.dev0"')
    return os.path.join(repo, ".git")


def test_tool_appends_unlisted_commits_as_open(trl_history, tmp_path):
    tool = _tool()
    path = str(tmp_path / "ledger.tsv")
    tool.write([], path)
    new = tool.append(tool.commit_records(trl_history, "main"), path)
    assert [(r["pr"], r["first_release"], r["verdict"]) for r in new] == [("12", "0.15.0", "open"), ("14", "0.16.0", "open")]
    assert [r["change"] for r in ledger.read_records(path)] == [r["change"] for r in new]
    # a second run finds nothing new; a triaged record is kept as it is
    records = ledger.read_records(path)
    records[0]["verdict"] = "not-a-bug"
    tool.write(records, path)
    assert tool.append(tool.commit_records(trl_history, "main"), path) == []
    assert [r["verdict"] for r in ledger.read_records(path)] == ["not-a-bug", "open"]


def test_tool_lists_changed_grpo_files_of_two_wheels(tmp_path):
    import zipfile

    tool = _tool()
    files = {"trl/trainer/grpo_trainer.py": "a", "trl/trainer/sft_trainer.py": "a", "trl/data_utils.py": "a"}
    for version, changed in (("1.0.0", {}), ("1.0.1", {"trl/trainer/grpo_trainer.py": "b", "trl/trainer/sft_trainer.py": "b"})):
        with zipfile.ZipFile(tmp_path / f"trl-{version}-py3-none-any.whl", "w") as wheel:
            for name, text in {**files, **changed}.items():
                wheel.writestr(name, text)
    records = tool.wheel_records(str(tmp_path / "trl-1.0.0-py3-none-any.whl"), str(tmp_path / "trl-1.0.1-py3-none-any.whl"))
    assert [(r["change"], r["first_release"], r["verdict"]) for r in records] == [
        ("1.0.0..1.0.1:trl/trainer/grpo_trainer.py", "1.0.1", "open")
    ]
    # a file already split into behaviours (#1, #2) counts as listed
    path = str(tmp_path / "ledger.tsv")
    tool.write([dict(records[0], change=records[0]["change"] + "#1", verdict="not-a-bug")], path)
    assert tool.append(records, path) == []


def test_the_ledger_is_not_read_at_import():
    code = "import sys, trl_compat; print('trl_compat.ledger' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


# --- the audit and the run-time check, on versions and statuses given here ---


@pytest.fixture
def stack(monkeypatch):
    """``stack(trl="0.22.1", ...)``: the versions the audit reads (others: not installed)."""
    from trl_compat._engine import versions as engine_versions
    from trl_compat.ledger import audit

    def set_versions(**versions):
        found = {dist.replace("_", "-"): v for dist, v in versions.items()}
        lookup = lambda dist: found.get(dist.replace("_", "-"))  # noqa: E731
        monkeypatch.setattr(engine_versions, "dist_version", lookup)
        monkeypatch.setattr(audit, "dist_version", lookup)

    return set_versions


def test_audit_trl_0_22_1(stack):
    from trl_compat.ledger import audit

    stack(trl="0.22.1", transformers="4.55.4", peft="0.17.1")
    rows = {r["id"]: r for r in audit.audit({"scale-rewards-swapped": "applied", "eval-before-train-ga": "not needed"})["bugs"]}
    assert rows["scale-rewards-swapped"]["action"] == "fixed"
    assert "fixes it here" in rows["scale-rewards-swapped"]["message"]
    assert rows["eval-before-train-ga"]["action"] == "not needed"
    assert rows["none-reward-baseline"]["action"] == "not fixable here"  # status not given here: not applied
    assert rows["none-reward-baseline"]["fixed_in"] == "1.6.0"
    assert "trl#5902" not in rows  # its record names the patch
    # outside their windows
    assert "vllm-double-bos" not in rows  # needs vLLM installed
    assert "trl#5891" in rows and "liger" in rows["trl#5891"]["when"]
    assert "scale-rewards-swapped" not in {r["id"] for r in _audit_at(stack, "0.23.1")}
    assert "1.15.0:grpo_trainer.py#3" in rows  # a wheel change: DataParallel replicas, fixed in 1.15.0
    # a patched bug read from the wheels: its registry entry's window (PR #4577's cast, 0.26.0 on), no gap below it
    assert not any(i.startswith("dora-magnitude-bf16") for i in rows)
    stack(trl="1.14.2", peft="0.18.1")
    assert "dora-magnitude-bf16" in {r["id"] for r in audit.audit({})["bugs"]}
    assert "dora-magnitude-bf16" not in {r["id"] for r in _audit_at(stack, "1.14.2")}  # without peft: no DoRA


def _audit_at(stack, trl):
    from trl_compat.ledger import audit

    stack(trl=trl)
    return audit.audit({})["bugs"]


def test_audit_cherry_picks_end_the_window_at_the_earliest_release(stack):
    rows = {r["id"]: r for r in _audit_at(stack, "1.7.0")}
    # PR #6139 (colocate + PEFT hang) is in 1.7.1 (cherry-pick) and 1.8.0
    assert rows["trl#6139"]["fixed_in"] == "1.7.1"
    assert "trl#6139" not in {r["id"] for r in _audit_at(stack, "1.7.1")}


def test_audit_names_a_patched_bug_below_its_patchs_window(stack):
    """none-reward-baseline's bug is there from 0.16.0 (its record's ``since``); the patch reaches 0.19.0 on."""
    from trl_compat.ledger import audit

    below = "none-reward-baseline (TRL < 0.19.0)"
    stack(trl="0.17.0")
    rows = {r["id"]: r for r in audit.audit({})["bugs"]}
    assert below in rows and "none-reward-baseline" not in rows
    assert rows[below]["action"] == "not fixable here" and rows[below]["fixed_in"] == "1.6.0"
    stack(trl="0.19.0")
    rows = {r["id"]: r for r in audit.audit({"none-reward-baseline": "applied"})["bugs"]}
    assert rows["none-reward-baseline"]["action"] == "fixed" and below not in rows
    assert below not in {r["id"] for r in _audit_at(stack, "0.15.2")}


def test_audit_no_trl_no_bug(stack):
    from trl_compat.ledger import audit

    stack()
    assert audit.audit({}) == {"versions": audit.audit({})["versions"], "bugs": [], "unfixed": 0}


def test_run_conditions():
    import types

    from trl_compat.ledger import runtime

    args = types.SimpleNamespace(
        use_vllm=True, vllm_mode="colocate", vllm_enable_sleep_mode=True, use_liger_kernel=False, world_size=2
    )
    model = types.SimpleNamespace(peft_config={"default": None})
    assert runtime.run_conditions(args, model, {"tools": [print]}) == {
        "vllm",
        "vllm_colocate",
        "vllm_sleep",
        "multi_gpu",
        "peft",
        "tools",
    }
    assert runtime.run_conditions(types.SimpleNamespace(), None, {}) == set()
    dora = types.SimpleNamespace(use_dora=True, target_modules=["q_proj", "lm_head"], is_prompt_learning=False)
    assert runtime.run_conditions(types.SimpleNamespace(), None, {"peft_config": dora}) == {"peft", "dora", "peft_lm_head"}
    prefix = types.SimpleNamespace(is_prompt_learning=True)
    assert runtime.run_conditions(types.SimpleNamespace(), None, {"peft_config": prefix}) == {"peft", "peft_prompt_learning"}


def test_run_conditions_of_the_options_users_turn_on():
    import types

    from trl_compat.ledger import runtime

    args = types.SimpleNamespace(
        use_transformers_paged=True,
        off_policy_mask_threshold=0.5,
        beta=0.04,
        cast_lm_head_to_fp32=True,
        torch_compile=True,
        use_vllm=True,
        vllm_mode="server",
        vllm_guided_decoding_regex=r"\d+",
    )
    vlm = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=object()), generation_config=object())
    call = {"reward_funcs": ["some/reward-model", print]}
    assert runtime.run_conditions(args, vlm, call) == {
        "paged",
        "opsm",
        "kl",
        "lm_head_fp32",
        "torch_compile",
        "vllm",
        "vllm_server",
        "structured_outputs",
        "vlm",
        "reward_model",
    }
    # what a plain text run with one reward function and the defaults meets: none of them
    text = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=None), generation_config=object())
    defaults = types.SimpleNamespace(beta=0.0, off_policy_mask_threshold=None, num_generations_eval=None)
    assert runtime.run_conditions(defaults, text, {"reward_funcs": print, "processing_class": object()}) == set()
    # a processor with an image processor makes a VLM run
    processor = types.SimpleNamespace(image_processor=object())
    bare = types.SimpleNamespace(config=types.SimpleNamespace(), generation_config=None)
    assert runtime.run_conditions(defaults, bare, {"processing_class": processor}) == {"vlm"}


def test_every_opt_in_record_is_matched_at_run_time_or_says_why_not():
    """An opt-in record's ``when`` names the option, so that a run that turns it on is warned; the
    records left without one are those whose option a trainer's construction cannot see."""
    from trl_compat import ledger

    no_condition = {r["change"] for r in ledger.read_records() if ledger.verdict_kind(r["verdict"]) == "opt-in" and not r["when"]}
    # reward functions returning None: known only once rewards are computed; TRL's CLI scripts: the
    # crash comes before any trainer is built; checkpointing's kwargs dropped after each generation: TRL's own
    # default kwargs are dropped too, so every run with gradient checkpointing on transformers 4 meets it
    assert no_condition == {"87fbb831d", "1.12.0..1.13.0:trl/trainer/utils.py#1", "1.15.0..1.16.0:trl/models/utils.py#1"}


def test_runtime_warns_for_an_unfixed_bug_whose_conditions_the_run_meets(stack, caplog):
    import logging

    from trl_compat.ledger import runtime

    stack(trl="1.5.0")
    assert [r["id"] for r in runtime.warnings_for({"zero3", "liger"}, {}) if r["id"] == "trl#5891"] == ["trl#5891"]
    assert "trl#5891" not in [r["id"] for r in runtime.warnings_for({"zero3"}, {})]
    assert "trl#5891" not in [r["id"] for r in runtime.warnings_for({"liger"}, {})]
    stack(trl="1.6.0")
    assert "trl#5891" not in [r["id"] for r in runtime.warnings_for({"zero3", "liger"}, {})]
    stack(trl="1.5.0")
    import types

    runtime._warned.discard("trl#5891")
    args = types.SimpleNamespace(use_liger_kernel=True, hf_deepspeed_config=types.SimpleNamespace(is_zero3=lambda: True))
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        assert "trl#5891" in runtime.check(args, None, {})
        assert "trl#5891" not in runtime.check(args, None, {})  # once per process
    logged = [r.getMessage() for r in caplog.records if "trl#5891" in r.getMessage()]
    assert len(logged) == 1 and "ZeRO-3" in logged[0] and "1.6.0" in logged[0]


def test_cli_audit_without_trl(capsys, stack):
    import json

    from trl_compat.__main__ import main

    stack()
    assert main(["audit", "--json", "--strict"]) == 0
    assert json.loads(capsys.readouterr().out)["bugs"] == []


def test_every_condition_reads_in_a_sentence():
    from trl_compat import ledger
    from trl_compat.ledger import audit

    assert set(audit.CONDITION_TEXT) == set(ledger.CONDITIONS)


def test_a_condition_the_option_names_is_said_once():
    """The audit's sentence and the run-time warning read ``(with use_transformers_paged)``, not
    ``(with use_transformers_paged + use_transformers_paged)``; other conditions are still listed."""
    from trl_compat.ledger import audit

    bug = {
        "summary": "continuous batching broken",
        "source": "ledger",
        "option": "use_transformers_paged",
        "when": ["paged", "zero3"],
        "fixed_in": "1.5.0",
        "upstream": "https://github.com/huggingface/trl/pull/5818",
    }
    text = audit.describe(bug, audit.NOT_FIXABLE)
    assert "(with use_transformers_paged + ZeRO-3)" in text, text
