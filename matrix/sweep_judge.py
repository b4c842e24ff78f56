"""Judging one build's row: a crash, a patch applied outside its KNOWN window, or a status that differs
from what a COMMITS entry (or ``expected_at``) says of that build's code."""

from packaging.version import Version
from sweep_commits import COMMITS
from sweep_known import KNOWN

V = Version


def finds_bug(rec):
    """Whether a report record says its probe found the bug: "applied", or "disabled" for an opt-in patch.

    check() runs without any TRL_COMPAT_ variable, so an opt-in patch (logps-temperature) whose probe
    finds the bug reports "disabled" with a reason starting "opt-in, off"; were its switch set, it would
    report "applied". "disabled" for any other reason (TRL_COMPAT_DISABLE) says nothing about the code."""
    if rec["status"] == "applied":
        return True
    return rec["status"] == "disabled" and rec.get("reason", "").startswith("opt-in, off")


def judge(row):
    version, _, commit = row["version"].partition("@")
    v = V(version)
    versions = row.get("versions", {})
    expect = (row.get("expect") or next((e for c, _, e in COMMITS if c == commit), None) or {}) if commit else {}
    problems = []
    if row["crash"]:
        problems.append("CRASH")
    status = {rec["id"]: rec["status"] for rec in row["report"]}
    found = {rec["id"] for rec in row["report"] if finds_bug(rec)}
    for pid, applies in expect.items():
        if (pid in found) != applies:
            problems.append(f"WRONG {pid}")
    for pid, st in status.items():
        known = KNOWN.get(pid, lambda *_: False)
        # a dev build of X carries code of the line before X or of X itself: either may hold the bug
        expected = known(v, versions) or (commit and known(V(v.base_version), versions))
        if pid not in expect and st == "applied" and not expected:
            problems.append(f"WRONG {pid}")
    return problems
