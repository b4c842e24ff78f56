"""``python -m trl_compat [--json]``: what trl_compat did here, for bug reports.

``trl-compat run -- CMD [ARGS...]``: run CMD with trl_compat active in it and in every Python
process it starts (see :mod:`trl_compat.activation`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import json
import platform
import sys

import trl_compat
from trl_compat import activation
from trl_compat._engine import PENDING, dist_version, pep440, registry, settings
from trl_compat.patches import NEWEST_KNOWN_TRL, OLDEST_KNOWN_TRL

# What `trl-compat --help` prints: plain text (the docstring above is reST, for the docs).
DESCRIPTION = """\
python -m trl_compat [--json]      what trl_compat did here (trl_compat's version first): for bug reports
trl-compat audit [--json] [--strict]
                                   which known TRL bugs this stack has, and what trl_compat does about each
                                   (also python -m trl_compat --audit); --strict: exit 1 if one is not fixed
trl-compat run -- CMD [ARGS...]    run CMD with trl_compat active in it and in every Python process it starts"""

STACK = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "vllm")


def collect() -> dict:
    """Import each pending patch's trigger module so its probe runs, then report."""
    import_errors = {}
    for patch in registry():
        if trl_compat.status(patch.id) == PENDING and patch.trigger not in import_errors:
            try:
                # Libraries print banners on import (DeepSpeed: "Setting accelerator to CPU");
                # keep stdout for the report so --json stays parseable.
                with contextlib.redirect_stdout(sys.stderr):
                    importlib.import_module(patch.trigger)
            except Exception as exc:  # noqa: BLE001 - that is what the report is for
                import_errors[patch.trigger] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    records = []
    for rec in trl_compat.report():
        row = rec.as_dict()
        for name, error in import_errors.items():
            if rec.status == PENDING and rec.target.startswith(name + "."):
                row["reason"] = f"importing {name} failed: {error}"
        records.append(row)
    versions = {"python": platform.python_version(), "trl_compat": trl_compat.__version__}
    versions.update({dist: dist_version(dist) for dist in STACK})
    trl = trl_range(versions["trl"], _has_grpo_trainer() if versions["trl"] else False)
    known = [p.id for p in registry()]
    return {
        "trl_compat": trl_compat.__version__,  # first: a bug report pasted from here says which trl_compat
        "headline": headline(trl_compat.__version__, trl),
        "counts": counts(records),
        "trl": trl,
        "versions": versions,
        "settings": settings.problems(known, [p.opt_in for p in registry() if p.opt_in]),
        "activation": activation.describe(),
        "guard": guard_description(versions["trl"]),
        "patches": records,
    }


def guard_description(trl: str | None) -> dict:
    from trl_compat.guard._describe import describe

    return describe(trl)


def _has_grpo_trainer() -> bool:
    try:
        return importlib.util.find_spec("trl.trainer.grpo_trainer") is not None
    except Exception:  # noqa: BLE001 - a broken trl: the patches' rows say why
        return False


def trl_range(version: str | None, has_grpo: bool) -> dict:
    """Where the installed TRL lies against the releases trl_compat knows: ``{"version", "known",
    "where": "inside"|"older"|"newer"|"not installed"|"unreadable", "note"}`` (note: "" inside)."""
    known = f"{OLDEST_KNOWN_TRL} to {NEWEST_KNOWN_TRL}"
    found = {"version": version, "known": known, "where": "inside", "note": ""}
    parsed = pep440.parse(version) if version else None
    if version is None:
        found.update(where="not installed", note="trl is not installed: no patch applies")
    elif parsed is None:
        found.update(where="unreadable", note=f"trl {version}: not a version trl_compat can read")
    elif not has_grpo or parsed.key() < _key(OLDEST_KNOWN_TRL):
        found.update(
            where="older",
            note=(
                f"trl {version} is outside the releases trl_compat knows ({known}): it has no GRPOTrainer "
                f"(added in {OLDEST_KNOWN_TRL}), so every patch says 'not needed'"
            ),
        )
    elif parsed.key() > _key(NEWEST_KNOWN_TRL):
        found.update(
            where="newer",
            note=(
                f"trl {version} is newer than the newest release trl_compat knows ({NEWEST_KNOWN_TRL}): 'not needed' "
                "only means no known bug's window holds it; bugs of later releases are not covered"
            ),
        )
    return found


def _key(version: str) -> tuple:
    parsed = pep440.parse(version)
    assert parsed is not None, version
    return parsed.key()


def headline(version: str, trl: dict) -> str:
    if trl["note"]:
        return f"trl_compat {version}: {trl['note']}"
    return f"trl_compat {version} (knows trl {trl['known']}; installed: {trl['version']})"


# The statuses the counts line always shows, in its order; any other status present follows.
COUNTED = ("applied", "not needed", "disabled", "undecided")
# The order of the report's rows: what acts on this run first, what needs a look next, the rest after.
ROW_ORDER = (
    "applied",
    "failed",
    "conflict",
    "target missing",
    "unknown version",
    "undecided",
    "disabled",
    "pending",
    "reverted",
    "not needed",
)


def counts(records: list[dict]) -> dict:
    """How many patches have each status: the four :data:`COUNTED` always, then any other present."""
    found = {status: 0 for status in COUNTED}
    for row in records:
        found[row["status"]] = found.get(row["status"], 0) + 1
    return found


def counts_line(found: dict) -> str:
    return ", ".join(f"{n} {status}" for status, n in found.items() if n or status in COUNTED)


def _row_rank(row: dict) -> int:
    return ROW_ORDER.index(row["status"]) if row["status"] in ROW_ORDER else len(ROW_ORDER)


def render(data: dict) -> str:
    lines = [data["headline"]]
    if "counts" in data:
        lines.append(f"patches: {counts_line(data['counts'])}")
    lines.append("")
    width = max(len(k) for k in list(data["versions"]) + ["activation", "settings", "guard"])
    for dist, version in data["versions"].items():
        if dist != "trl_compat":
            lines.append(f"  {dist:<{width}}  {version or '-'}")
    if "activation" in data:
        lines += ["", f"  {'activation':<{width}}  {data['activation']['summary']}"]
    if "guard" in data:
        lines.append(f"  {'guard':<{width}}  {data['guard']['summary']}")
        if data["guard"]["mode"] != "off":
            lines += [f"  {'':<{width}}    {check}: {row['where']}" for check, row in data["guard"]["checks"].items()]
    for variable, setting in data.get("settings", {}).items():
        said = setting["problem"] or f"{variable}={setting['value']!r}"
        lines.append(f"  {'settings':<{width}}  {said}")
    lines.append("")
    ordered = sorted(data["patches"], key=_row_rank)  # stable: registry order within a status
    rows = [("patch", "status", "reason")] + [(r["id"], r["status"], r["reason"]) for r in ordered]
    w_id = max(len(r[0]) for r in rows)
    w_st = max(len(r[1]) for r in rows)
    for pid, st, reason in rows:
        lines.append(f"  {pid:<{w_id}}  {st:<{w_st}}  {reason}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="trl-compat", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--audit", action="store_true", help="the known TRL bugs of this stack (see `audit`)")
    parser.add_argument("--strict", action="store_true", help="with --audit: exit 1 when a bug that applies is not fixed")
    parser.add_argument("--version", action="version", version=f"%(prog)s {trl_compat.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{report,audit,run}")
    report = commands.add_parser("report", help="what trl_compat did here (the default)")
    # SUPPRESS: `trl-compat --json report` must keep the --json given before the command.
    report.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON")
    audit = commands.add_parser(
        "audit",
        help="which known TRL bugs this stack has, and what trl_compat does about each",
        description="Every bug of trl_compat's upstream ledger whose window holds the installed versions: "
        "fixed (patch applied), not needed (the code has the fix), advice (the upgrade that ends it) or not "
        "fixable here, with what triggers it.",
    )
    audit.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the audit as JSON")
    audit.add_argument("--strict", action="store_true", default=argparse.SUPPRESS, help="exit 1 when a bug that applies is not fixed")
    run = commands.add_parser(
        "run",
        help="run a command with trl_compat active in every Python process it starts",
        description="Run CMD with trl_compat active in it and in every Python process it starts on this "
        "node (accelerate launch, torchrun, deepspeed, trl, multiprocessing): a sitecustomize "
        "put first on PYTHONPATH imports trl_compat at start-up.",
        usage="trl-compat run -- CMD [ARGS...]",
    )
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]", help="the command to run")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from trl_compat.activation.launcher import run

        return run(args.cmd)
    data = collect()
    if args.audit or args.command == "audit":
        return run_audit(data, args.json, args.strict)
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0


def run_audit(report: dict, as_json: bool, strict: bool) -> int:
    """Print the audit of this stack (after :func:`collect` ran every pending probe); the exit status."""
    from trl_compat.ledger import audit

    data = audit.audit({row["id"]: row["status"] for row in report["patches"]})
    data = {"trl_compat": report["trl_compat"], "headline": report["headline"], **data}
    print(json.dumps(data, indent=2) if as_json else data["headline"] + "\n" + audit.render(data))
    return 1 if strict and data["unfixed"] else 0


if __name__ == "__main__":
    sys.exit(main())
