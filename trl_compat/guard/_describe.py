"""What ``python -m trl_compat`` says of the guard: its mode and, per check, where it can run on
the installed stack (decided from versions alone: whether a run is in process or in server mode
is only known once it runs)."""

from __future__ import annotations

from trl_compat._engine import pep440, settings
from trl_compat.guard._ledger import CHECKS


def _at_least(version: str | None, release: tuple) -> bool | None:
    parsed = pep440.parse(version) if version else None
    return None if parsed is None else tuple(parsed.release[:2]) >= release


def where(trl: str | None) -> dict[str, str]:
    """Per check: where it runs, and what it cannot see."""
    returns_logprobs = _at_least(trl, (0, 23))
    returns_prompt_ids = _at_least(trl, (0, 24))
    return {
        "P": "in process: vLLM's own prompt ids; server mode: "
        + ("the server's prompt ids" if returns_prompt_ids else "the text sent, tokenised again with the trainer's tokenizer"),
        "S": "in process and server mode: the sampling parameters sent",
        "C": "in process: the engine's calls; server mode: weight sync then reset_prefix_cache before generate, on the client",
        "W1": "in process (the engine model's load_weights); server mode: not on the client (NCCL)",
        "W2": "in process only (the engine's model); in a `trl vllm-serve` process where trl_compat and the guard are active",
        "L": (
            "TRL asks vLLM for log-probs itself"
            if returns_logprobs
            else "the guard asks vLLM for log-probs (logprobs=0) in process; server mode: unavailable (the server returns none)"
        )
        + "; compared only where the log-prob domains and temperatures agree and no top-k/top-p/penalty applies",
    }


def describe(trl: str | None) -> dict:
    mode = settings.guard_mode()
    return {
        "mode": mode,
        "summary": (
            "off (TRL_COMPAT_GUARD=1 turns on the off-policy checks; =strict also raises OffPolicyError)"
            if mode == "off"
            else f"{mode}: checks {', '.join(CHECKS)} (see README, 'The off-policy guard')"
        ),
        "checks": {check: {"compares": CHECKS[check], "where": text} for check, text in where(trl).items()},
    }
