"""matrix/USER_INSTALLS.md from the rows' results."""

from __future__ import annotations

from packaging.version import Version

HEADER = """# Users' installs

What `pip install trl==X peft` gives a user, for every TRL release from 0.14.0 to 1.16.0, resolved at
two dates: the end of the release's month (what its users installed then) and {today} (what a user
installing that pin gets now). Resolved with `uv pip install --exclude-newer DATE`, torch the CPU wheel
2.13.0 (not of that date: the only torch here; a requirement of its own that the date cannot meet is
taken as of the run, and the row says so), nothing else; trl_compat added without its
dependencies. In each: `from trl import GRPOTrainer`, then 2 GRPO steps on the tiny model, full and
with LoRA, plain and with `import trl_compat` first. Written by `python matrix/user_installs`
(60 - 150 s a row on 2 cores; matrix/README.md, "Users' installs"); rows not run yet say so.

A row that fails plain names the patch that fixes it (**fixed by**: the applied patch whose symptom is
the error; **applied**: every patch that applied); a row that fails with trl_compat is a bug of
trl_compat's. **Undeclared**: each module the trainer's import loaded (with trl_compat)
from a distribution that TRL's requirements (no extras) do not bring, imported again in a fresh
process with that module hidden: "optional" where TRL guards it, "needed" where the import then
fails: the class of `requests-optional` (its modules show in the plain column's error
instead, where they are missing). The ledger's rule reads the "needed" ones
(`tools/update_ledger.py users`).

{summary}

"""
COLUMNS = (
    "TRL",
    "date",
    "transformers",
    "peft",
    "datasets",
    "requests",
    "plain: import / full / LoRA",
    "trl_compat: import / full / LoRA",
    "applied",
    "undeclared",
)


# A missing module imported inside `if is_x_available():` means a wrong availability answer, the bug of
# these patches; one at a module's top level means an undeclared requirement.
GUARDED_IMPORT_PATCHES = ("transformers5-import",)


def fixed_by(row: dict) -> str:
    """The applied patch whose symptom is the plain import's error (its exception and module named),
    told apart by where TRL imported the module; "" when the plain run did not fail at import."""
    from trl_compat.patches import PATCHES

    plain, applied = row.get("plain") or {}, (row.get("trl_compat") or {}).get("applied", [])
    error = plain.get("import", "ok")
    if error == "ok" or not applied:
        return ""
    kind, _, detail = error.partition(":")
    module = detail.strip().rpartition(" ")[2].strip("'").partition(".")[0]
    symptoms = {p.id: p.symptom for p in PATCHES if p.id in applied}
    found = [i for i, text in symptoms.items() if kind in text and module in text]
    site = plain.get("site")
    if len(found) > 1 and site:
        found = [i for i in found if (i in GUARDED_IMPORT_PATCHES) is not site.get("top_level")]
    return ", ".join(found) or "?"


def fixed_by_training(row: dict) -> str:
    """The applied patches whose symptom holds the plain run's training error (full or LoRA); "" when
    the plain run trained or failed at import."""
    from trl_compat.patches import PATCHES

    plain, applied = row.get("plain") or {}, (row.get("trl_compat") or {}).get("applied", [])
    errors = {plain.get(k) for k in ("full", "lora")} - {None, "trains"}
    if plain.get("import", "ok") != "ok" or not errors:
        return ""
    found = [p.id for p in PATCHES if p.id in applied and any(error in p.symptom for error in errors)]
    return ", ".join(found) or "?"


def _cell(mode: dict | None, row: dict | None = None) -> str:
    if not mode:
        return "not run"
    plain = row is not None and mode.get("mode") == "plain"
    if mode.get("import") != "ok":
        fix = fixed_by(row) if plain else ""
        return f"import: `{mode.get('import')}`" + (f" (fixed by **{fix}**)" if fix else "")
    parts = [mode.get(k, "?") for k in ("full", "lora")]
    fix = fixed_by_training(row) if plain else ""
    return "ok / " + " / ".join("trains" if p == "trains" else f"`{p}`" for p in parts) + (f" (fixed by **{fix}**)" if fix else "")


def _needs(row: dict) -> str:
    """The undeclared modules, each with what hiding it did: "optional" (TRL guards it) or the error."""
    needs = row.get("needs", {})
    if row.get("needs_unchecked"):
        return ", ".join(f"{m}: not checked" for m in sorted(needs))
    return "; ".join(f"{m}: {'optional' if v == 'optional' else f'needed (`{v}`)'}" for m, v in sorted(needs.items()))


def trains(mode: dict | None) -> bool:
    return bool(mode) and mode.get("import") == "ok" and mode.get("full") == "trains" and mode.get("lora") == "trains"


def summary(results: list[dict]) -> str:
    done = [r for r in results if "plain" in r or "error" in r]
    compat_ok = sum(trains(r.get("trl_compat")) for r in done)
    plain_ok = sum(trains(r.get("plain")) for r in done)
    unresolved = [f"{r['trl']} ({r['date']})" for r in done if "error" in r]
    lines = [
        f"Rows run: {len(done)} of {len(results)}; train with trl_compat: {compat_ok}; train plain: {plain_ok}.",
    ]
    if unresolved:
        lines.append(f"Not resolvable at their date: {', '.join(unresolved)}.")
    failing = [f"{r['trl']} ({r['date']})" for r in done if "error" not in r and not trains(r.get("trl_compat"))]
    lines.append(f"Fail with trl_compat: {', '.join(failing) if failing else 'none'}.")
    return "\n".join(lines)


def _exempt(row: dict) -> str:
    """The torch wheel's own requirements taken as of the run, where the date had none it accepts."""
    names = row.get("exempt_from_date") or []
    return f"; {', '.join(names)} as of the run (the CPU torch's requirement)" if names else ""


def write(path, results: list[dict], today: str, seconds: float) -> None:
    results = sorted(results, key=lambda r: (Version(r["trl"]), r["date"]))
    text = HEADER.format(today=today, summary=summary(results))
    text += "| " + " | ".join(COLUMNS) + " |\n" + "|---" * len(COLUMNS) + "|\n"
    for r in results:
        v = r.get("versions", {})
        if "error" in r:
            middle = f"{r['error']} | | "
        else:
            middle = f"{_cell(r.get('plain'), r)} | {_cell(r.get('trl_compat'))} | "
        compat = r.get("trl_compat") or {}
        text += (
            f"| {r['trl']} | {r['date']} ({r['date_kind']}){_exempt(r)} | {v.get('transformers', '')} | {v.get('peft', '')} | "
            f"{v.get('datasets', '')} | {v.get('requests', 'absent') if v else ''} | {middle}"
            f"{', '.join(compat.get('applied', []))} | {_needs(r)} |\n"
        )
    path.write_text(text)
