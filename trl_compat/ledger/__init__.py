"""The upstream ledger: a verdict for every TRL change to GRPO's code paths since 0.14.0.

``grpo.tsv`` (next to this module) has one record per TRL commit that touches a GRPO file, and one
per behaviour changed between two published releases whose history is not readable (wheel diffs).
Its header says how it was made and counts the verdicts. ``import trl_compat`` never reads it: the
audit (``trl-compat audit``) and the run-time check read it when they run.

Columns (tab-separated; a line starting with ``#`` is a comment):

``change``         the commit (9 hex digits), or ``OLD..NEW:file[#n]`` for a change read from two wheels,
                   or ``open:<n>`` for a bug no release has fixed (``upstream-open``; ``n`` its issue or PR)
``pr``             TRL's pull request (or issue) number, when known
``first_release``  the earliest TRL release that has it (through a cherry-pick too)
``verdict``        ``patched:<id>`` | ``advice:<id>`` | ``not-a-bug`` | ``not-reachable:<why>`` |
                   ``opt-in:<option>`` | ``upstream-open[:<id>]`` | ``open`` (not triaged yet; the tests allow none)
                   ``upstream-open``: a bug in every release from ``since`` on, open upstream when read (no
                   ``first_release``); ``<id>`` the registry entry that patches it (``fixed_in={}``, an open
                   window), none where trl_compat does not (its ``reason`` says why)
``since``          for a bug fixed by this change: the first release that has the bug (its window is
                   ``since`` up to ``first_release``); empty otherwise
``when``           what a run needs for the bug to bite, comma-separated (see ``CONDITIONS``); empty: always
``reason``         one line: why this verdict
``title``          the commit's subject
"""

from __future__ import annotations

import os

LEDGER_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "grpo.tsv")
COLUMNS = ("change", "pr", "first_release", "verdict", "since", "when", "reason", "title")
VERDICT_KINDS = ("patched", "advice", "not-a-bug", "not-reachable", "opt-in", "upstream-open", "open")
# the kinds whose value names registry ids
NAMES_IDS = ("patched", "advice", "upstream-open")
# The run-time conditions a record's ``when`` may name (trl_compat.ledger.runtime checks them).
CONDITIONS = (
    "deepspeed",
    "zero3",
    "fsdp",
    "peft",
    # what the PEFT config holds: DoRA, target_parameters, an adapter on lm_head, prompt learning (prefix/prompt tuning)
    "dora",
    "peft_target_parameters",
    "peft_lm_head",
    "peft_prompt_learning",
    "liger",
    "tools",
    "vllm",
    "vllm_server",
    "vllm_colocate",
    "vllm_sleep",
    "multi_gpu",
    # the options a user turns on that the opt-in records need
    "vlm",  # a vision-language model or processor
    "paged",  # use_transformers_paged
    "opsm",  # off_policy_mask_threshold (DeepSeek's off-policy sequence mask)
    "kl",  # beta > 0: a reference model
    "reward_model",  # a reward model among the reward functions
    "torch_compile",
    "structured_outputs",  # vLLM's regex-constrained decoding
    "lm_head_fp32",  # cast_lm_head_to_fp32
)

Record = dict[str, str]


def read_records(path: str = LEDGER_PATH) -> list[Record]:
    """The ledger's records, in file order (a missing file other than trl_compat's own: none)."""
    if not os.path.exists(path):
        if path == LEDGER_PATH:
            raise FileNotFoundError(f"trl_compat's ledger is missing from the installed package: {path}")
        return []
    records = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            line = line.rstrip("\n")
            if not line.strip() or line.startswith("#"):
                continue
            fields = line.split("\t")
            if fields == list(COLUMNS):
                continue
            if len(fields) != len(COLUMNS):
                raise ValueError(f"{path}:{number}: {len(fields)} fields, expected {len(COLUMNS)} ({', '.join(COLUMNS)})")
            records.append(dict(zip(COLUMNS, fields)))
    return records


def verdict_kind(verdict: str) -> str:
    """``patched:foo`` -> ``patched``; ``not-a-bug`` -> ``not-a-bug``."""
    return verdict.split(":", 1)[0]


def verdict_value(verdict: str) -> str:
    """``patched:foo`` -> ``foo``; ``not-a-bug`` -> ``""``."""
    return verdict.split(":", 1)[1] if ":" in verdict else ""


def verdict_ids(verdict: str) -> list[str]:
    """The registry ids a ``patched:``/``advice:``/``upstream-open:`` verdict names (``patched:a,b`` -> ``["a", "b"]``)."""
    if verdict_kind(verdict) not in NAMES_IDS:
        return []
    return [part.strip() for part in verdict_value(verdict).split(",") if part.strip()]


def summary(records: list[Record]) -> dict[str, int]:
    """What the ledger's header states: records read from commits and from wheels, and per verdict kind."""
    counts = {
        "records": len(records),
        "commits": sum(1 for r in records if ".." not in r["change"] and not r["change"].startswith("open:")),
        "wheel changes": sum(1 for r in records if ".." in r["change"]),
    }
    for kind in VERDICT_KINDS:
        counts[kind] = sum(1 for r in records if verdict_kind(r["verdict"]) == kind)
    counts["registry ids named"] = len({i for r in records for i in verdict_ids(r["verdict"])})
    return counts


def header_lines(records: list[Record]) -> list[str]:
    """The ledger's header (comment lines), counts included; tools/update_ledger.py writes it."""
    counts = summary(records)
    return [
        "# The upstream ledger: one record per TRL change to GRPO's code paths since v0.14.0 (see trl_compat/ledger/__init__.py).",
        "# Commits: every commit after v0.14.0 on main (1.10.0.dev0) and the release branches that touches",
        "#   trl/trainer/{grpo_trainer,grpo_config,utils}.py, trl/models/utils.py, trl/extras/vllm_client.py,",
        "#   trl/scripts/vllm_serve.py, trl/generation/, trl/data_utils.py, trl/import_utils.py, trl/_compat.py.",
        "#   first_release: earliest final tag that contains the commit or a cherry-pick of its PR; main after v1.9.0: 1.10.0.",
        "# Wheels: 1.9.0 .. 1.16.0, consecutive pairs, one record per changed behaviour of a GRPO file (1.9.1..1.9.2 and",
        "#   1.11.0..1.12.0 change no GRPO file). Appending: python tools/update_ledger.py git|wheels ...; header: --header.",
        "# Counts: {records} records ({commits} commits, {wheel changes} wheel changes); patched {patched}, advice {advice}, "
        "not-a-bug {not-a-bug}, not-reachable {not-reachable}, opt-in {opt-in}, upstream-open {upstream-open}, open {open}; "
        "{registry ids named} registry ids named.".format(**counts),
    ]
