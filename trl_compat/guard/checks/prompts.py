"""Check P: the prompt ids vLLM generated from == the loss's prompt ids, row by row.

Exact. In process, vLLM's own ``RequestOutput.prompt_token_ids``; where only the text sent to a
server is known (``trl vllm-serve`` before TRL 0.24 returns no prompt ids), vLLM's tokenisation is
re-done with the trainer's tokenizer (``encode(text)``, special tokens added as vLLM's
``generate`` adds them), and the alarm says so. Catches prompts truncated for the loss but not
for vLLM, special tokens stripped from vLLM's text, a doubled BOS, and any future drift in how
TRL builds the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trl_compat.guard._ledger import Alarm
from trl_compat.guard._records import Sampled
from trl_compat.guard._run import Run

SNIPPET = 8


def _engine_prompt(sampled: Sampled, tokenizer: Any) -> tuple[list | None, bool]:
    if sampled.prompt_ids is not None:
        return list(sampled.prompt_ids), False
    if sampled.prompt_text is not None and hasattr(tokenizer, "encode"):
        ids = list(tokenizer.encode(sampled.prompt_text))
        return (ids[-sampled.truncate :] if sampled.truncate else ids), True
    return None, False


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return min(len(a), len(b))


def likely_cause(engine: list[int], loss: list[int], tokenizer: Any) -> tuple[str, str | None]:
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and engine[:2] == [bos, bos] and loss[:2] != [bos, bos]:
        return "vLLM added a BOS to a prompt text that already starts with one (double BOS)", "vllm-double-bos"
    if len(engine) > len(loss) and engine[-len(loss) :] == loss:
        return "the loss's prompt was truncated (max_prompt_length) but vLLM got the whole prompt", "vllm-prompt-truncation"
    if len(engine) < len(loss) and set(loss) - set(engine):
        return (
            "the prompt text sent to vLLM lost tokens the loss has (special tokens stripped when decoding it?)",
            "vllm-prompt-special-tokens",
        )
    if len(engine) < len(loss) and loss[-len(engine) :] == engine:
        return "vLLM got a shorter prompt than the loss (truncated on the other side)", None
    return "the prompt vLLM generated from is not the loss's prompt", None


def check(run: Run, rows: list[tuple[int, list[int], Sampled]], tokenizer: Any) -> None:
    """``rows``: (row index, loss prompt ids, the matched vLLM completion), at the run's step."""
    mismatched, simulated = 0, False
    first: tuple[int, list[int], list[int]] | None = None
    for index, loss_prompt, sampled in rows:
        engine_prompt, was_simulated = _engine_prompt(sampled, tokenizer)
        if engine_prompt is None:
            continue
        if engine_prompt != loss_prompt:
            mismatched += 1
            simulated = simulated or was_simulated
            if first is None:
                first = (index, engine_prompt, loss_prompt)
    run.add("prompt_mismatch_rows", mismatched)
    if first is None:
        return
    index, engine_prompt, loss_prompt = first
    at = _first_difference(engine_prompt, loss_prompt)
    cause, fix = likely_cause(engine_prompt, loss_prompt, tokenizer)
    run.fire(
        Alarm(
            "P",
            f"{mismatched} of {len(rows)} rows' prompt ids differ; row {index}: vLLM {len(engine_prompt)} ids "
            f"{engine_prompt[:SNIPPET]}..., the loss {len(loss_prompt)} ids {loss_prompt[:SNIPPET]}..., first difference at "
            f"position {at}" + (" (vLLM's tokenisation of the text sent to the server, re-done here)" if simulated else ""),
            cause,
            fix=fix,
            figures={
                "rows": len(rows),
                "mismatched": mismatched,
                "position": at,
                "engine_len": len(engine_prompt),
                "loss_len": len(loss_prompt),
            },
            step=run.step,
        )
    )
