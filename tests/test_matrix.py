"""The matrix's lists agree (stack-free: reads tox.ini, matrix/cells/ and matrix/sweep_commits.py only).

- ``tox.ini``'s ``env_list`` runs every cell of ``matrix/cells/`` but those of its ``by-hand`` label
  (each with a section of its own, so that ``tox -e <cell>`` finds it), and names nothing else that
  would fall to the default env (whose deps are ``matrix/cells/{env_name}.txt``): an extra has its
  own ``[testenv:...]`` section.
- ``matrix/sweep_commits.py`` reads what a main-branch build must say from the commits that brought and
  fixed each bug (``expected_at``), on a small git history built here.
"""

import configparser
import importlib.util
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def tox_ini():
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    return tox


def env_list():
    tox = tox_ini()
    entries = [line.split("#")[0].strip() for line in tox["tox"]["env_list"].splitlines()]
    return [e for e in entries if e], {s.split(":", 1)[1] for s in tox.sections() if s.startswith("testenv:")}


def matrix_script(name):
    """A script of matrix/ loaded as a module (they are not a package)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "matrix" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def by_hand():
    """The cells of the ``by-hand`` label, as write_results.py reads them (run before each release)."""
    return sorted(matrix_script("write_results").by_hand_cells(ROOT / "tox.ini"))


def test_tox_env_list_runs_every_cell_and_only_known_extras():
    envs, own_sections = env_list()
    cells = {path.stem for path in (ROOT / "matrix" / "cells").glob("*.txt")}
    assert cells, "no cells found in matrix/cells"
    assert len(envs) == len(set(envs)), f"env_list names an env twice: {sorted(e for e in envs if envs.count(e) > 1)}"
    hand = by_hand()
    assert not set(hand) & set(envs), f"cells both in the default run and by hand: {sorted(set(hand) & set(envs))}"
    assert set(hand) <= cells and set(hand) <= own_sections, f"by-hand cells need a lock file and a [testenv:<cell>] section: {hand}"
    missing = sorted(cells - set(envs) - set(hand))
    assert not missing, f"cells in matrix/cells/ that neither tox.ini's env_list nor its by-hand label runs: {missing}"
    unknown = sorted(e for e in envs if e not in cells and e not in own_sections)
    assert not unknown, f"env_list names envs with neither a matrix/cells/<env>.txt nor a [testenv:<env>] section: {unknown}"


@pytest.fixture(scope="module")
def sweep():
    return matrix_script("sweep_commits")  # COMMITS, BUG_SPANS, expected_at


def test_every_span_names_a_patch_and_every_build_is_listed_once(sweep):
    from trl_compat.patches import PATCHES

    assert set(sweep.BUG_SPANS) <= {p.id for p in PATCHES}
    commits = [commit for commit, _, _ in sweep.COMMITS]
    assert len(commits) == len(set(commits))
    assert all(brought or fixed for brought, fixed in sweep.BUG_SPANS.values())


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_expected_at_reads_which_commits_a_build_contains(sweep, tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    ids = []
    for name in ("base", "brings", "middle", "fixes", "after"):
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", name)
        ids.append(git("rev-parse", "HEAD"))
    base, brings, middle, fixes, after = ids
    monkeypatch.setattr(sweep, "BUG_SPANS", {"a": (brings, fixes), "b": (None, fixes), "c": (middle, None)})
    dot_git = tmp_path / ".git"
    assert sweep.expected_at(dot_git, base) == {"a": False, "b": True, "c": False}
    assert sweep.expected_at(dot_git, brings) == {"a": True, "b": True, "c": False}
    assert sweep.expected_at(dot_git, middle) == {"a": True, "b": True, "c": True}
    assert sweep.expected_at(dot_git, fixes) == {"a": False, "b": False, "c": True}
    assert sweep.expected_at(dot_git, after) == {"a": False, "b": False, "c": True}
    with pytest.raises(RuntimeError, match="merge-base"):
        sweep.expected_at(dot_git, "0" * 40)


def test_every_patch_that_applies_in_a_cell_applies_in_a_cell_of_the_default_run():
    """Cutting a cell out of the default run (to by hand) must not leave a patch that no default run
    applies, and so proves: the cells of ``env_list`` and the rows of ``vllm-cpu-real`` (one per TRL
    release it swaps in), read against tests/support/expected_status.py's one table."""
    from expected_status import APPLIED

    envs, _ = env_list()
    default = set(envs)
    if "vllm-cpu-real" in envs:
        releases = (ROOT / "matrix" / "vllm_cpu" / "trl-releases.txt").read_text().splitlines()
        default |= {f"vllm-cpu-real-trl{r.strip()}" for r in releases if r.strip() and not r.startswith("#")}
    anywhere = set().union(*APPLIED.values())
    in_default = set().union(*(APPLIED.get(cell, set()) for cell in default))
    assert anywhere - in_default == set(), {
        patch: sorted(cell for cell, applied in APPLIED.items() if patch in applied) for patch in anywhere - in_default
    }


def test_by_hand_rows_are_dated_and_kept_until_their_env_runs_again(tmp_path):
    """A run of some by-hand envs rewrites their rows and keeps the others' (older ones without a date
    column get the section's date), but not the row of an env that left the by-hand label; the default
    run's tables stay when only by-hand envs ran."""
    import datetime
    import json

    write_results = matrix_script("write_results")
    hand = sorted(write_results.by_hand_cells())
    ran, kept = hand[0], hand[1]
    previous = "\n".join(
        [
            "# Matrix results",
            "",
            "the default run's tables",
            "",
            write_results.BY_HAND_HEADING,
            "",
            "Not in the default run; these rows are from 2026-11-20.",
            "",
            "| cell | applied | disabled | tests (passed / failed / skipped per module) | " + " | ".join(write_results.STACK) + " |",
            "|---|---|---|---|" + "---|" * len(write_results.STACK),
            f"| {ran} | `old` | - | test_x 1 / 0 / 0 | " + " | ".join("-" for _ in write_results.STACK) + " |",
            f"| {kept} | `kept` | - | test_y 2 / 0 / 0 | " + " | ".join("-" for _ in write_results.STACK) + " |",
            "| trl9.9.9-former | `gone` | - | test_w 1 / 0 / 0 | " + " | ".join("-" for _ in write_results.STACK) + " |",
        ]
    )
    output = tmp_path / "RESULTS.md"
    output.write_text(previous + "\n")
    results = tmp_path / "results"
    results.mkdir()
    report = {"patches": [{"id": "new", "status": "applied"}], "versions": {"trl": "9.9.9"}}
    (results / f"{ran}.json").write_text(json.dumps(report))
    (results / f"{ran}.xml").write_text('<testsuite><testcase classname="tests.test_z" name="t"/></testsuite>')
    assert write_results.main(results, output) == 0
    text = output.read_text()
    assert "the default run's tables" in text  # only by-hand envs ran
    rows = {
        line.split(" | ")[0][2:]: line for line in text.splitlines() if line.startswith(f"| {ran} ") or line.startswith(f"| {kept} ")
    }
    assert f"| {datetime.date.today()} | `new` |" in rows[ran] and "9.9.9" in rows[ran] and "test_z 1 / 0 / 0" in rows[ran]
    assert "| 2026-11-20 | `kept` |" in rows[kept]  # carried over, dated as its section was
    assert "trl9.9.9-former" not in text  # no longer a by-hand env: not carried


def test_failures_name_each_failed_test_and_its_message(tmp_path):
    """What ``results`` prints last, so that the end of a CI log names the failed tests."""
    xml = tmp_path / "cell.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.patches.test_a" name="test_ok" time="0.1"/>'
        '<testcase classname="tests.patches.test_a" name="test_bad" time="0.1">'
        '<failure message="AssertionError: 1 == 2&#10;second line">trace</failure></testcase>'
        '<testcase classname="tests.test_b" name="test_broken" time="0.1"><error message="">boom</error></testcase>'
        '<testcase classname="tests.test_b" name="test_skip" time="0.1"><skipped message="no"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert matrix_script("write_results").failures(xml) == [
        "tests.patches.test_a::test_bad: AssertionError: 1 == 2",
        "tests.test_b::test_broken: boom",
    ]
    assert matrix_script("write_results").failures(tmp_path / "missing.xml") == []


def test_users_installs_table_names_the_patch_that_fixes_a_plain_training_failure():
    """USER_INSTALLS.md: a row whose plain run fails at a GRPO step names the applied patch whose symptom
    holds that error (TRL 1.15.0 without Triton); a row that trains plain names none."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("users_table", ROOT / "matrix" / "user_installs" / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    error = "AttributeError: 'NoneType' object has no attribute 'apply'"
    patch_id = "fused-lm-head-no-triton"
    row = {
        "plain": {"mode": "plain", "import": "ok", "full": error, "lora": error},
        "trl_compat": {"mode": "trl_compat", "import": "ok", "full": "trains", "lora": "trains", "applied": [patch_id]},
    }
    assert table.fixed_by_training(row) == "fused-lm-head-no-triton"
    assert table._cell(row["plain"], row).endswith("(fixed by **fused-lm-head-no-triton**)")
    row["plain"].update(full="trains", lora="trains")
    assert table.fixed_by_training(row) == "" and table._cell(row["plain"], row) == "ok / trains / trains"
