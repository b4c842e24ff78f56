"""``python -m trl_compat [--json]``: what trl_compat did here, for bug reports."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import platform
import sys
from typing import List, Optional

import trl_compat
from trl_compat._engine import PENDING, dist_version, registry

STACK = ("torch", "transformers", "trl", "peft", "accelerate", "deepspeed", "vllm")


def collect() -> dict:
    """Import each pending patch's trigger module so its probe runs, then report."""
    import_errors = {}
    for patch in registry():
        if trl_compat.status(patch.id) == PENDING and patch.module not in import_errors:
            try:
                # Libraries print banners on import (DeepSpeed: "Setting accelerator to CPU");
                # keep stdout for the report so --json stays parseable.
                with contextlib.redirect_stdout(sys.stderr):
                    importlib.import_module(patch.module)
            except Exception as exc:  # noqa: BLE001 - that is what the report is for
                import_errors[patch.module] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    records = []
    for rec in trl_compat.report():
        row = rec.as_dict()
        for name, error in import_errors.items():
            if rec.status == PENDING and rec.target.startswith(name + "."):
                row["reason"] = f"importing {name} failed: {error}"
        records.append(row)
    versions = {"python": platform.python_version(), "trl_compat": trl_compat.__version__}
    versions.update({dist: dist_version(dist) for dist in STACK})
    return {"versions": versions, "patches": records}


def render(data: dict) -> str:
    lines = ["trl_compat " + data["versions"]["trl_compat"], ""]
    width = max(len(k) for k in data["versions"])
    for dist, version in data["versions"].items():
        if dist != "trl_compat":
            lines.append(f"  {dist:<{width}}  {version or '-'}")
    lines.append("")
    rows = [("patch", "status", "reason")] + [(r["id"], r["status"], r["reason"]) for r in data["patches"]]
    w_id = max(len(r[0]) for r in rows)
    w_st = max(len(r[1]) for r in rows)
    for pid, st, reason in rows:
        lines.append(f"  {pid:<{w_id}}  {st:<{w_st}}  {reason}")
    return "\n".join(lines)


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="trl-compat", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    data = collect()
    print(json.dumps(data, indent=2) if args.json else render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main())
