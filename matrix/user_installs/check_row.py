"""Run inside a user's stack (its venv's python, cwd tests/support): ``from trl import GRPOTrainer``,
then 2 GRPO steps on the tiny model, full and with LoRA; with ``--compat``, ``import trl_compat``
first. Prints one line ``ROW <json>``.

Besides the outcome, it lists the modules the trainer's import loaded whose distribution TRL's
requirements (no extras, followed through their own requirements) do not provide: the class of
bug ``requests-optional`` fixes, seen from the import (the ledger's mechanical rule)."""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import math
import pathlib
import sys
import tempfile
import traceback
import types

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement_closure(dist: str) -> set[str]:
    """``dist`` and every distribution its requirements (no extras) bring, as installed."""
    seen, todo = set(), [dist]
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return seen


def undeclared(before: set[str]) -> list[str]:
    """Top-level modules imported since ``before`` that come from distributions outside TRL's
    requirement closure (the standard library and trl_compat aside)."""
    provided = requirement_closure("trl")
    owners = importlib.metadata.packages_distributions()
    found = set()
    for name in set(sys.modules) - before:
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top.startswith("_") or top in ("trl_compat",):
            continue
        dists = {canonicalize_name(d) for d in owners.get(top, [])}
        if dists and not dists & provided:
            found.add(f"{top} ({', '.join(sorted(dists))})")
    return sorted(found)


def last_line(exc: BaseException) -> str:
    lines = [line for line in traceback.format_exception_only(type(exc), exc)[-1].splitlines() if line.strip()]
    text = lines[-1] if lines else repr(exc)
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, RuntimeError) and cause is not None:  # TRL's lazy module wraps the real error
        text = last_line(cause)
    return text[:300]


def import_site(exc: BaseException) -> dict | None:
    """Where in TRL a ``ModuleNotFoundError`` was raised: the innermost frame in TRL's package, and
    whether that line is a statement of the module's top level (an unconditional import, which TRL's
    requirements must provide) or inside a block (an ``if is_x_available():`` whose answer was wrong:
    another class of bug). None for other errors."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    missing = next((e for e in chain if isinstance(e, ModuleNotFoundError)), None)
    if missing is None:
        return None
    frames = [f for f in traceback.extract_tb(missing.__traceback__) if "/trl/" in f.filename.replace("\\", "/")]
    if not frames:
        return None
    frame = frames[-1]
    with open(frame.filename, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    top = any(s.lineno <= frame.lineno <= (s.end_lineno or s.lineno) for s in tree.body if isinstance(s, (ast.Import, ast.ImportFrom)))
    path = frame.filename.replace("\\", "/").rpartition("/trl/")[2]
    return {"module": missing.name, "file": f"trl/{path}", "line": frame.lineno, "top_level": top}


def hidden_import(modules: list[str]) -> None:
    """``--hide a,b``: ``import trl_compat; from trl import GRPOTrainer`` with those top-level modules
    unimportable, as an install without them: "needed" when the import then fails on one of them
    (TRL imports it unconditionally), "optional" when it succeeds (TRL guards it). With trl_compat,
    so that what fails is the hidden module, not one a patch already answers."""
    for name in modules:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        import trl_compat  # noqa: F401

        from trl import GRPOTrainer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 -- any failure of TRL's import is the row's answer
        print("ROW", json.dumps({"mode": "hidden", "import": last_line(exc)}), flush=True)
        return
    print("ROW", json.dumps({"mode": "hidden", "import": "ok"}), flush=True)


def import_grpo_run():
    """The tests' GRPO runner. A user's stack has no pytest and grpo_run only subclasses its skip
    exception: a stub stands in while grpo_run is imported, and only then (after TRL's import: some
    libraries ask ``importlib.util.find_spec("pytest")``, which a stub without a spec breaks)."""
    if importlib.util.find_spec("pytest") is not None:
        import grpo_run

        return grpo_run
    stub = types.ModuleType("pytest")
    stub.skip = types.SimpleNamespace(Exception=Exception)  # type: ignore[attr-defined]
    sys.modules["pytest"] = stub
    try:
        import grpo_run
    finally:
        del sys.modules["pytest"]
    return grpo_run


def main() -> None:
    if "--hide" in sys.argv:
        return hidden_import(sys.argv[sys.argv.index("--hide") + 1].split(","))
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests" / "support"))  # grpo_run, tiny
    compat = "--compat" in sys.argv
    row: dict = {"mode": "trl_compat" if compat else "plain"}
    before = set(sys.modules)
    try:
        if compat:
            import trl_compat
        from trl import GRPOTrainer  # noqa: F401
    except Exception as exc:  # noqa: BLE001 -- any failure of TRL's import is the row's answer
        row["import"] = last_line(exc)
        row["site"] = import_site(exc)
        print("ROW", json.dumps(row), flush=True)
        return
    row["import"] = "ok"
    row["undeclared"] = undeclared(before)
    grpo_run = import_grpo_run()

    for name, peft in (("full", False), ("lora", True)):
        try:
            trainer, history = grpo_run.run_grpo(tempfile.mkdtemp(), steps=2, peft=peft)
            losses = grpo_run.train_losses(history)
            ok = bool(losses) and all(math.isfinite(x) for x in losses) and bool(grpo_run.changed_trainable(trainer))
            row[name] = "trains" if ok and trainer.state.global_step == 2 else f"no training: losses {losses}"
        except Exception as exc:  # noqa: BLE001 -- any failure of the run is the row's answer
            row[name] = last_line(exc)
    if compat:
        row["applied"] = sorted(r.id for r in trl_compat.report() if r.status == "applied")
    print("ROW", json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
