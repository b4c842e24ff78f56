"""``trl-compat audit``: which known TRL bugs the installed stack has, and what trl_compat does about each.

A bug is either a registry entry (the ledger names it ``patched:<id>`` or ``advice:<id>``: its window
is the entry's ``requires``, and what trl_compat does is the patch's status), or a ledger record
trl_compat has no entry for (``not-reachable:``, ``opt-in:``; a ``patched:`` id this version's
registry lacks): its window is TRL ``since`` up to the record's first release, and trl_compat
cannot fix it. An ``upstream-open`` record (no release has the fix) names its registry entry, or, where
trl_compat has none, is such a ledger bug with an open window: "not fixed upstream yet". A patched
bug that reaches releases below its patch's window (``since`` earlier: code the patch does not reach)
is named for those releases too, as not fixable here. A bug "applies" when its window holds the
installed versions; the ``when`` column says what a run also needs for it to bite (ZeRO-3, PEFT,
tools, ...), which only the run knows (:mod:`trl_compat.ledger.runtime` checks it when a
``GRPOTrainer`` is built).

What trl_compat does, per bug that applies:

``fixed``             the patch is applied
``not needed``        the patch's probe found TRL's code already fixed
``advice``            an advice entry: the upgrade that ends it
``not fixable here``  no patch (or the patch could not act: its status says why); the release that ends it
"""

from __future__ import annotations

import types

from trl_compat import ledger
from trl_compat._engine import APPLIED, NOT_NEEDED, dist_version, gate
from trl_compat._engine.versions import affected

FIXED = "fixed"
NOT_NEEDED_HERE = "not needed"
ADVICE = "advice"
NOT_FIXABLE = "not fixable here"
UNFIXED = (ADVICE, NOT_FIXABLE)

# How each run-time condition reads in a sentence.
CONDITION_TEXT = {
    "deepspeed": "DeepSpeed",
    "zero3": "ZeRO-3",
    "fsdp": "FSDP",
    "peft": "PEFT",
    "dora": "DoRA",
    "peft_target_parameters": "LoRA target_parameters",
    "peft_lm_head": "an adapter on lm_head",
    "peft_prompt_learning": "prompt learning (prefix/prompt tuning)",
    "liger": "use_liger_kernel",
    "tools": "tools",
    "vllm": "use_vllm",
    "vllm_server": "vLLM server mode",
    "vllm_colocate": "vLLM colocate mode",
    "vllm_sleep": "vllm_enable_sleep_mode",
    "multi_gpu": "several processes",
    "vlm": "a vision-language model",
    "paged": "use_transformers_paged",
    "opsm": "off_policy_mask_threshold",
    "kl": "beta > 0",
    "reward_model": "a reward model",
    "torch_compile": "torch_compile",
    "structured_outputs": "vLLM structured outputs",
    "lm_head_fp32": "cast_lm_head_to_fp32",
}


def bugs(records: list[ledger.Record] | None = None, registry_ids: dict[str, object] | None = None) -> list[dict]:
    """Every bug the ledger knows, one dict each (registry entries first, in registry order)."""
    from trl_compat.patches import PATCHES

    records = ledger.read_records() if records is None else records
    entries = {p.id: p for p in PATCHES} if registry_ids is None else registry_ids
    named: dict[str, list[ledger.Record]] = {}
    found: list[dict] = []
    by_pr: dict[str, dict] = {}
    for record in records:
        kind = ledger.verdict_kind(record["verdict"])
        ids = ledger.verdict_ids(record["verdict"])
        known = [i for i in ids if i in entries]
        for i in known:
            named.setdefault(i, []).append(record)
        if kind in ("not-reachable", "opt-in") or (not known and (kind == "upstream-open" or ids and kind == "patched")):
            bug = _ledger_bug(record, kind, ids)
            key = record["pr"] or bug["id"]
            if key in by_pr:  # a cherry-pick: the earliest release that has the fix ends the window
                _merge(by_pr[key], bug)
            else:
                by_pr[key] = bug
                found.append(bug)
    registry_bugs = [_registry_bug(entries[i], named[i]) for i in entries if i in named]
    gaps = [gap for i in entries if i in named for gap in _below_the_window(entries[i], named[i])]
    return registry_bugs + gaps + found


def _below_the_window(patch, records: list[ledger.Record]) -> list[dict]:
    """The releases a patched bug reaches below its patch's window (the record's ``since`` is earlier:
    TRL's code there is one the patch does not reach): named, not fixable here."""
    from trl_compat._engine import pep440

    lower = _lower_bound(patch.requires.get("trl", ""))
    gaps: list[dict] = []
    for record in records:
        since, start = pep440.parse(record["since"] or ""), pep440.parse(lower)
        if ledger.verdict_kind(record["verdict"]) != "patched" or since is None or start is None:
            continue
        if since.key() < start.key() and not any(g["requires"]["trl"] == affected(record["since"], lower) for g in gaps):
            gap = _ledger_bug(record, "patched", [f"{patch.id} (TRL < {lower})"])
            gap["requires"] = {"trl": affected(record["since"], lower)}
            gap["fixed_in"] = _fixed_in(patch.requires.get("trl", "")) or gap["fixed_in"]
            gaps.append(gap)
    return gaps


def _conditions(records: list[ledger.Record]) -> list[str]:
    seen: list[str] = []
    for record in records:
        for condition in filter(None, record["when"].split(",")):
            if condition not in seen:
                seen.append(condition)
    return seen


def _registry_bug(patch, records: list[ledger.Record]) -> dict:
    kinds = {ledger.verdict_kind(r["verdict"]) for r in records}
    return {
        "id": patch.id,
        "source": "registry",
        "kind": "advice" if kinds == {"advice"} else "patched",
        "summary": patch.symptom or patch.summary,  # what a user sees; the fix's summary where none is written
        "upstream": patch.upstream,
        "requires": dict(patch.requires),
        "fixed_in": _fixed_in(patch.requires.get("trl", "")),
        "when": _conditions(records),
        "changes": [r["change"] for r in records],
    }


def _ledger_bug(record: ledger.Record, kind: str, ids: list[str]) -> dict:
    fixed_in = record["first_release"]  # "" for upstream-open: no release has the fix
    since = record["since"] or fixed_in
    what = ledger.verdict_value(record["verdict"])
    return {
        "id": ids[0] if ids else f"trl#{record['pr']}" if record["pr"] else _short(record["change"]),
        "source": "ledger",
        "kind": kind,
        "summary": record["reason"],
        "upstream": _upstream(record),
        "requires": {"trl": affected(since, fixed_in or None)},
        "fixed_in": fixed_in,
        "when": [c for c in record["when"].split(",") if c],
        "option": what if kind == "opt-in" else "",
        "unreachable": what if kind == "not-reachable" else "",
        "changes": [record["change"]],
    }


def _upstream(record: ledger.Record) -> str:
    if record["pr"]:
        return f"https://github.com/huggingface/trl/pull/{record['pr']}"
    if ".." in record["change"]:
        pair, path = record["change"].split(":", 1)
        old, new = pair.split("..")
        return f"TRL's {path.split('#')[0]}, changed between the {old} and {new} wheels"
    return f"TRL commit {record['change']}"


def _short(change: str) -> str:
    """A record's name in the audit: ``1.14.2..1.15.0:trl/trainer/grpo_trainer.py#2`` -> ``1.15.0:grpo_trainer.py#2``."""
    if ".." not in change:
        return change
    pair, path = change.split(":", 1)
    return pair.split("..")[1] + ":" + path.rsplit("/", 1)[-1]


def _merge(bug: dict, other: dict) -> None:
    from trl_compat._engine import pep440

    bug["changes"] += other["changes"]
    mine, theirs = pep440.parse(bug["fixed_in"]), pep440.parse(other["fixed_in"])
    if mine is not None and theirs is not None and theirs.key() < mine.key():
        bug["fixed_in"], bug["requires"] = other["fixed_in"], other["requires"]


def _lower_bound(spec: str) -> str:
    """``>=0.19.0.dev0,<1.6.0a0`` -> ``0.19.0``; ``""`` where there is none."""
    for clause in spec.split(","):
        clause = clause.strip()
        if clause.startswith(">="):
            return clause[2:].replace(".dev0", "")
    return ""


def _fixed_in(spec: str) -> str:
    """``>=0.22.0.dev0,<0.23.0a0`` -> ``0.23.0``; ``""`` when the window is open."""
    for clause in spec.split(","):
        clause = clause.strip()
        if clause.startswith("<"):
            return clause.lstrip("<=").replace("a0", "")
    return ""


def applies(bug: dict) -> bool:
    """Whether the installed versions lie inside the bug's window."""
    # gate() reads a patch's `requires` only: the same window rule as the patches' (dev builds included)
    status, _reason, _versions = gate(types.SimpleNamespace(requires=bug["requires"]))  # type: ignore[arg-type]
    return status is None


def action(bug: dict, statuses: dict[str, str]) -> str:
    if bug["source"] == "ledger":
        return NOT_FIXABLE
    if bug["kind"] == "advice":
        return ADVICE
    status = statuses.get(bug["id"])
    if status == APPLIED:
        return FIXED
    if status == NOT_NEEDED:
        return NOT_NEEDED_HERE
    return NOT_FIXABLE


def describe(bug: dict, act: str, status: str = "") -> str:
    """One sentence: what the bug is, when it bites, what ends it, what trl_compat does."""
    when = " with " + " + ".join(CONDITION_TEXT.get(c, c) for c in bug["when"]) if bug["when"] else ""
    if not bug["fixed_in"]:
        ends = "not fixed upstream yet"
    elif bug["source"] == "registry":  # the registry's window may end after the fix release (dev builds, probes)
        ends = f"trl_compat's window ends at TRL {bug['fixed_in']}"
    else:
        ends = f"fixed in TRL {bug['fixed_in']}"
    if bug["source"] == "ledger" and bug.get("option"):
        # a condition the option already names is said once ("use_transformers_paged", not "... + use_transformers_paged")
        extra = [CONDITION_TEXT.get(c, c) for c in bug["when"] if CONDITION_TEXT.get(c, c) not in bug["option"]]
        when = f" with {bug['option']}" + (" + " + " + ".join(extra) if extra else "")
    text = f"{bug['summary']}{' (' + when.strip() + ')' if when else ''}: {bug['upstream']}, {ends}"
    if act == FIXED:
        return text + "; trl_compat fixes it here"
    if act == NOT_NEEDED_HERE:
        return text + "; this TRL's code has the fix already"
    if act == ADVICE:
        return text + "; trl_compat cannot patch it: upgrade"
    why = f" (patch status: {status})" if status and bug["source"] == "registry" else ""
    if bug.get("unreachable"):
        why = f" (out of its reach: {bug['unreachable']})"
    upgrade = f": upgrade TRL to {bug['fixed_in']} or later" if bug["fixed_in"] else ""
    return text + f"; trl_compat does not fix it{why}{upgrade}"


def audit(statuses: dict[str, str] | None = None) -> dict:
    """The audit of the installed stack: ``{"versions", "bugs": [...], "unfixed": n}``; ``statuses``:
    each patch's status (default: trl_compat's report now)."""
    if statuses is None:
        from trl_compat._engine import report  # the engine's, not trl_compat's: no import cycle

        statuses = {r.id: r.status for r in report()}
    rows = []
    for bug in bugs():
        if not applies(bug):
            continue
        act = action(bug, statuses)
        rows.append(
            {
                "id": bug["id"],
                "source": bug["source"],
                "action": act,
                "status": statuses.get(bug["id"], ""),
                "when": bug["when"],
                "option": bug.get("option", ""),
                "fixed_in": bug["fixed_in"],
                "upstream": bug["upstream"],
                "message": describe(bug, act, statuses.get(bug["id"], "")),
                "changes": bug["changes"],
            }
        )
    versions = {dist: dist_version(dist) for dist in ("trl", "transformers", "peft", "deepspeed", "vllm", "huggingface_hub")}
    return {"versions": versions, "bugs": rows, "unfixed": sum(1 for r in rows if r["action"] in UNFIXED)}


def render(data: dict) -> str:
    installed = ", ".join(f"{d} {v}" for d, v in data["versions"].items() if v)
    lines = [
        f"Known TRL bugs for this stack ({installed or 'trl not installed'}): {len(data['bugs'])}, {data['unfixed']} not fixed here",
        "",
    ]
    for action_name in (FIXED, NOT_NEEDED_HERE, ADVICE, NOT_FIXABLE):
        rows = [r for r in data["bugs"] if r["action"] == action_name]
        if rows:
            lines.append(f"{action_name} ({len(rows)}):")
            lines += [f"  {r['id']}: {r['message']}" for r in rows]
            lines.append("")
    return "\n".join(lines).rstrip() + "\n"
