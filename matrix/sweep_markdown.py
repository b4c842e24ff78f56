"""Writing matrix/SWEEP.md from the rows of a sweep."""

import pathlib

from sweep_judge import judge


def write(rows, output, seconds, commits_note):
    ids = []
    for row in rows:
        for rec in row["report"]:
            if rec["id"] not in ids:
                ids.append(rec["id"])
    crashes = sum(bool(r["crash"]) for r in rows)
    wrong = sum(p.startswith("WRONG") for r in rows for p in judge(r))
    lines = [
        "# Sweep: every TRL release from 0.14.0 to the newest",
        "",
        f"Written by `matrix/sweep.py` ({len(rows)} builds, {seconds:.0f} s). Each build was swapped into a",
        "base venv (`--no-deps`), then `import trl_compat`, `import trl.trainer.grpo_trainer, trl.models.utils`",
        "and `trl_compat.report()` ran in a fresh process, without `TRL_COMPAT_STRICT`.",
        "",
        f"**{crashes} crashes, {wrong} wrong applications.** A wrong application is a patch applied to a release",
        "outside the window where research found its bug (for a main-branch build `X.devN@commit`: the windows of",
        "X.devN and of X), or a patch the commit's entry lists (`COMMITS` in the script) whose status differs from what",
        'research found in that code (for an opt-in patch, off in the sweep, "disabled" is how it finds the bug).',
        "Short statuses: A applied, - not needed, P pending",
        "(its module did not import), U undecided, ? unknown version, M target missing, F failed, D disabled.",
        "",
        commits_note,
        "",
        "| trl | base (transformers) | grpo import | " + " | ".join(f"`{i}`" for i in ids) + " | flags |",
        "|---|---|---|" + "---|" * len(ids) + "---|",
    ]
    short = {
        "applied": "A",
        "not needed": "-",
        "pending": "P",
        "undecided": "U",
        "unknown version": "?",
        "target missing": "M",
        "failed": "F",
        "disabled": "D",
        "reverted": "R",
    }
    for row in rows:
        status = {rec["id"]: rec["status"] for rec in row["report"]}
        grpo = row["imports"].get("trl.trainer.grpo_trainer", "-")
        tf = row.get("versions", {}).get("transformers")
        lines.append(
            f"| {row['version']} | {row['base']} ({tf}) | {'ok' if grpo == 'ok' else grpo.replace('|', '/')} | "
            + " | ".join(short.get(status.get(i), status.get(i, "")) for i in ids)
            + f" | {', '.join(judge(row)) or 'ok'} |"
        )
    notes = [
        (row["version"], rec["id"], rec["status"], rec["reason"])
        for row in rows
        for rec in row["report"]
        if rec["status"] in ("undecided", "target missing", "failed", "unknown version")
    ]
    if notes:
        lines += ["", "## Patches that could not decide or apply", ""]
        lines += [f"- trl {v} `{pid}`: {st}: {reason}" for v, pid, st, reason in notes]
    for row in rows:
        if row["crash"]:
            lines += ["", f"## Crash on trl {row['version']}", "", "```", row["crash"][-2000:], "```"]
    pathlib.Path(output).write_text("\n".join(lines) + "\n")
    print(f"sweep: {len(rows) - crashes - wrong} passed, {crashes + wrong} failed")
    return 1 if crashes or wrong else 0
