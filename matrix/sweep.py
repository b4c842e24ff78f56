"""Sweep every TRL release on PyPI from 0.14.0 to the newest: import trl_compat,
import TRL's GRPO modules, take ``trl_compat.report()``; write matrix/SWEEP.md.

trl is pure Python, so each release is swapped (``pip install --no-deps``) into one
base venv per transformers line instead of building a venv per release:

* releases <= 0.19 use the 0.19.1 cell's pins (transformers 4.53.3) plus deepspeed 0.16.4;
* later 0.x releases use transformers 4.57.6 and 1.x releases the ``trl-newest`` cell's
  pins (transformers 5.x), unless the release's own ``Requires-Dist`` excludes it.

A row is flagged when importing trl_compat or taking the report raises, when a
traceback through trl_compat escapes into an import, or when a patch applies to a
release outside the window where research found its bug (``KNOWN``, kept
independent of the patches' own windows on purpose).

With ``--trl-git PATH`` (a clone of TRL's git history, bare or not) it also builds the
main-branch commits the patch docstrings name (``COMMITS``: each dev build around a window's
bound, on both sides of the fix, or of the commit that brought the bug) into the matching base
venv and checks the statuses of the patches each entry lists against that table, kept
independent of the probes (it says which fix commits each build contains; for the 0.21 - 0.28
builds, ``BUG_SPANS`` gives the commits that brought and fixed each bug, and ``git merge-base
--is-ancestor`` on the clone says which the build contains, kept with the row); the other patches
are judged by ``KNOWN`` on the build's dev version. An opt-in patch whose probe finds the bug
reports "disabled" (the sweep sets no switch), which counts as applying. Without ``--trl-git``
those rows are skipped, and SWEEP.md says so.

Usage: python matrix/sweep.py [--work DIR] [--versions 0.14.0,0.15.0] [--trl-git PATH] [--output matrix/SWEEP.md]

The parts, beside this entry point: ``sweep_known`` (the KNOWN windows), ``sweep_commits`` (COMMITS,
BUG_SPANS), ``sweep_bases`` (the base venvs), ``sweep_check`` (one build), ``sweep_judge`` (its row
judged), ``sweep_markdown`` (SWEEP.md).
"""

import argparse
import json
import os
import pathlib
import sys
import time

from packaging.version import Version
from sweep_bases import ROOT
from sweep_check import sweep_commit, sweep_one, trl_releases
from sweep_commits import COMMITS
from sweep_judge import judge
from sweep_markdown import write

V = Version


def _saved_rows(path):
    """The rows a ``--rows`` file holds, by build (a release's version or a commit)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as lines:
        return {entry["key"]: entry["row"] for entry in map(json.loads, lines)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / ".tox" / "sweep-work"))
    parser.add_argument("--versions", default="")
    parser.add_argument("--trl-git", default="", help="a clone of TRL's git history: also check COMMITS")
    parser.add_argument("--only-commits", action="store_true", help="skip the releases (with --trl-git)")
    parser.add_argument("--output", default=str(ROOT / "matrix" / "SWEEP.md"))
    parser.add_argument(
        "--rows",
        default="",
        help="a JSON-lines file: each finished build's row is appended to it, and builds already in it are not run "
        "again (a sweep stopped half-way resumes; delete the file after changing trl_compat)",
    )
    parser.add_argument("--commits", default="", help="only these COMMITS (comma-separated), with --trl-git")
    parser.add_argument("--no-run", action="store_true", help="write the output from the --rows file only")
    args = parser.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    versions = [] if args.only_commits else [V(v) for v in args.versions.split(",") if v] or trl_releases()
    git = pathlib.Path(args.trl_git) if args.trl_git else None
    if git is not None and (git / ".git").exists():
        git = git / ".git"
    if git is None:
        note = (
            f"The {len(COMMITS)} main-branch commits in `COMMITS` were skipped: no `--trl-git` "
            "(a clone of TRL's git history) was given."
        )
        print("sweep: " + note, flush=True)
    else:
        note = f"The {len(COMMITS)} main-branch commits in `COMMITS` were built from a clone of TRL's git history."
    t0 = time.time()
    saved = _saved_rows(args.rows)
    rows = []
    chosen = [c for c, _, _ in COMMITS if not args.commits or c in args.commits.split(",")]
    jobs = [(sweep_one, v) for v in versions] + ([(sweep_commit, c) for c in chosen] if git or args.no_run else [])
    left_out = 0
    for job, arg in jobs:
        key = str(arg) if job is sweep_one else arg
        if key in saved:
            rows.append(saved[key])
            continue
        if args.no_run:
            left_out += 1
            continue
        started = time.time()
        row = job(work, arg) if job is sweep_one else job(work, str(git), arg)
        row["seconds"] = time.time() - started
        rows.append(row)
        if args.rows:
            with open(args.rows, "a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, "row": row}) + "\n")
        print(
            f"trl {row['version']:>8} [{row['base']}]: "
            + " ".join(f"{r['id']}={r['status']}" for r in row["report"])
            + f"  {judge(row) or ''}",
            flush=True,
        )
    if left_out:
        note += f" {left_out} of the {len(jobs)} builds were not run yet (a partial sweep: `--rows` resumes it)."
    # the builds' own time, summed: a resumed sweep counts the rows it read back too
    return write(rows, args.output, sum(row.get("seconds", 0.0) for row in rows) or time.time() - t0, note)


if __name__ == "__main__":
    sys.exit(main())
