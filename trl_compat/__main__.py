"""``python -m trl_compat [--json]``: what trl_compat did here, for bug reports.

``trl-compat run -- CMD [ARGS...]``: run CMD with trl_compat active in it and in every Python
process it starts (see :mod:`trl_compat.activation`)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import platform
import sys
from typing import List, Optional

import trl_compat
from trl_compat import activation
from trl_compat._engine import PENDING, dist_version, registry

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
    return {"versions": versions, "activation": activation.describe(), "patches": records}


def render(data: dict) -> str:
    lines = ["trl_compat " + data["versions"]["trl_compat"], ""]
    width = max(len(k) for k in data["versions"])
    for dist, version in data["versions"].items():
        if dist != "trl_compat":
            lines.append(f"  {dist:<{width}}  {version or '-'}")
    if "activation" in data:
        lines += ["", f"  {'activation':<{width}}  {data['activation']['summary']}"]
    lines.append("")
    rows = [("patch", "status", "reason")] + [(r["id"], r["status"], r["reason"]) for r in data["patches"]]
    w_id = max(len(r[0]) for r in rows)
    w_st = max(len(r[1]) for r in rows)
    for pid, st, reason in rows:
        lines.append(f"  {pid:<{w_id}}  {st:<{w_st}}  {reason}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trl-compat", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--version", action="version", version=f"%(prog)s {trl_compat.__version__}")
    commands = parser.add_subparsers(dest="command", metavar="{report,run}")
    report = commands.add_parser("report", help="what trl_compat did here (the default)")
    # SUPPRESS: `trl-compat --json report` must keep the --json given before the command.
    report.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print the report as JSON")
    run = commands.add_parser(
        "run", help="run a command with trl_compat active in every Python process it starts",
        description="Run CMD with trl_compat active in it and in every Python process it starts on this "
                    "node (accelerate launch, torchrun, deepspeed, trl, multiprocessing): a sitecustomize "
                    "put first on PYTHONPATH imports trl_compat at start-up.",
        usage="trl-compat run -- CMD [ARGS...]")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]", help="the command to run")
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "run":
        from trl_compat.activation.launcher import run

        return run(args.cmd)
    data = collect()
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
