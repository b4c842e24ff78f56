"""The users'-installs sweep: ``python matrix/user_installs [--only 1.9.2,0.29.1] [--dates today]``.

Each (TRL release, date) row is resolved into a fresh venv (``stack``), checked plain and with
trl_compat (``check_row`` in that venv), its result kept in ``results.json`` beside this file and
its venv deleted; then matrix/USER_INSTALLS.md is written from every kept result. A rerun does only
the rows asked for (``--only``, ``--dates``) or missing (``--missing``), so a new TRL or transformers
release costs a row each."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import releases
import stack
import table

# the table names the patch that fixes a row (trl_compat's registry): the checkout's package
sys.path.insert(0, str(stack.ROOT))

HERE = pathlib.Path(__file__).resolve().parent
RESULTS = HERE / "results.json"
OUTPUT = stack.ROOT / "matrix" / "USER_INSTALLS.md"
SUPPORT = stack.ROOT / "tests" / "support"
CHECK = HERE / "check_row.py"
ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "OMP_NUM_THREADS": "1",
}


def load_kept() -> dict:
    return {(r["trl"], r["date_kind"]): r for r in json.loads(RESULTS.read_text())} if RESULTS.exists() else {}


@contextlib.contextmanager
def results_lock():
    """Two sweeps may run side by side (``--dates today`` and ``--dates month-end``): each write
    re-reads the kept results under a lock and adds its own row, so neither loses the other's."""
    with open(RESULTS.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def keep(result: dict) -> dict:
    with results_lock():
        kept = load_kept()
        kept[(result["trl"], result["date_kind"])] = result
        RESULTS.write_text(json.dumps(sorted(kept.values(), key=lambda r: (r["trl"], r["date_kind"])), indent=1) + "\n")
    return kept


def check(venv: pathlib.Path, compat: bool = False, hide: list[str] | None = None) -> dict:
    cmd = [venv / "bin" / "python", CHECK] + (["--compat"] if compat else []) + (["--hide", ",".join(hide)] if hide else [])
    env = dict(os.environ, PATH=f"{venv}/bin:{os.environ.get('PATH', '')}", **ENV)
    env = {k: v for k, v in env.items() if not k.startswith(("TRL_COMPAT_", "PYTHON", "VIRTUAL_ENV"))}
    try:
        out = stack.run(cmd, cwd=SUPPORT, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        return {"import": "timed out after 900 s"}
    rows = [line[4:] for line in out.stdout.splitlines() if line.startswith("ROW ")]
    if not rows:
        tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
        return {"import": f"crashed: {tail[:300]}"}
    return json.loads(rows[-1])


def needs_recheck(row: dict) -> bool:
    """A row written before the plain import said where it failed (``site``) or before the
    hidden-module checks (``needs_unchecked``)."""
    plain = row.get("plain")
    if not plain:
        return False
    return "needs_unchecked" in row or (plain.get("import") != "ok" and "site" not in plain)


def recheck_imports(row: dict, work: pathlib.Path, cache: pathlib.Path) -> dict:
    """A kept row's import checks again (the plain import and each undeclared module hidden), its
    training results kept: for rows written before those checks said what they say now."""
    venv = work / f"venv-{row['trl']}-{row['date_kind']}"
    built = stack.build(venv, row["trl"], row["date"], cache)
    if "versions" in built:
        row = dict(row, plain=dict(row.get("plain", {}), **check(venv, compat=False)))
        row.pop("needs_unchecked", None)
        for entry in (row.get("trl_compat") or {}).get("undeclared", []):
            module = entry.partition(" ")[0]
            hidden = check(venv, hide=[module])
            row.setdefault("needs", {})[module] = "optional" if hidden.get("import") == "ok" else hidden.get("import")
    shutil.rmtree(venv, ignore_errors=True)
    return row


def do_row(row: dict, work: pathlib.Path, cache: pathlib.Path) -> dict:
    venv = work / f"venv-{row['trl']}-{row['date_kind']}"
    built = stack.build(venv, row["trl"], row["date"], cache)
    result = dict(row, **built)
    if "versions" in built:
        result["plain"] = check(venv, compat=False)
        result["trl_compat"] = check(venv, compat=True)
        # each module loaded from outside TRL's requirements, hidden alone: does TRL's import need it?
        for entry in result["trl_compat"].get("undeclared", []):
            module = entry.partition(" ")[0]
            hidden = check(venv, hide=[module])
            result.setdefault("needs", {})[module] = "optional" if hidden.get("import") == "ok" else hidden.get("import")
    shutil.rmtree(venv, ignore_errors=True)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", help="comma-separated TRL releases")
    parser.add_argument("--dates", choices=("both", "today", "month-end"), default="both")
    parser.add_argument("--missing", action="store_true", help="only the rows without a kept result")
    parser.add_argument("--recheck-imports", action="store_true", help="kept rows only: their import checks again, not the training")
    parser.add_argument("--table", action="store_true", help="write matrix/USER_INSTALLS.md from the kept results, run no row")
    parser.add_argument("--today", default=datetime.date.today().isoformat())
    parser.add_argument("--work", type=pathlib.Path, default=None, help="venvs and the download cache (default: a temp dir)")
    args = parser.parse_args()
    today = datetime.date.fromisoformat(args.today)
    kept = load_kept()
    wanted = releases.rows(today, only=args.only.split(",") if args.only else None)
    todo = [r for r in wanted if args.dates in ("both", r["date_kind"]) and not (args.missing and (r["trl"], r["date_kind"]) in kept)]
    if args.recheck_imports:
        todo = [
            kept[(r["trl"], r["date_kind"])]
            for r in todo
            if (r["trl"], r["date_kind"]) in kept and needs_recheck(kept[(r["trl"], r["date_kind"])])
        ]
    if args.table:
        todo = []
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="user-installs-"))
    cache = work / "cache"
    cache.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    for i, row in enumerate(todo, 1):
        t0 = time.monotonic()
        result = recheck_imports(row, work, cache) if args.recheck_imports else do_row(row, work, cache)
        kept = keep(result)
        print(f"[{i}/{len(todo)}] {row['trl']} {row['date']}: {time.monotonic() - t0:.0f} s", flush=True)
    results = [kept.get((r["trl"], r["date_kind"]), r) for r in wanted]
    table.write(OUTPUT, results, today.isoformat(), time.monotonic() - started)
    return 0


if __name__ == "__main__":
    sys.exit(main())
