"""Completions of known lengths for a real GRPO run on the transformers generation path.

    fixed_completions.install(trainer)      # every generate() call returns these completions

TRL (0.14 - 1.x, ``use_vllm=False``) calls ``unwrapped_model.generate(input_ids=..., ...)`` and
cuts the completion off the returned ``(B, P + C)`` ids. After ``install`` the model's own
``generate`` still runs (sampling, TRL's generation config, any patch on it), then the completion
columns are replaced: row ``i`` of each call is ``EOS_ROW`` (``EOS_LENGTH`` tokens ending in EOS,
padded) when ``i`` is even, ``TRUNCATED_ROW`` (``LENGTH`` tokens, no EOS) when it is odd. So the
token counts a test expects are known without reading TRL: ``tokens_to_eos(ids)``.
"""

from __future__ import annotations

import functools

import torch

LENGTH = 8  # grpo_run's max_completion_length
EOS_LENGTH = 3


def rows(tokenizer) -> tuple[list[int], list[int]]:
    """(row ending in EOS, padded to LENGTH; row of LENGTH tokens without EOS)."""
    word = max(tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id or 0) + 7
    eos_row = [word] * (EOS_LENGTH - 1) + [tokenizer.eos_token_id] + [tokenizer.pad_token_id] * (LENGTH - EOS_LENGTH)
    return eos_row, [word] * LENGTH


def install(trainer) -> None:
    """Replace the completions of every ``generate`` call of ``trainer.model`` (see the module docstring)."""
    model = trainer.model
    eos_row, truncated_row = rows(trainer.processing_class)
    original = model.generate

    @functools.wraps(original)
    def generate(*args, **kwargs):
        out = original(*args, **kwargs)
        prompt_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]
        prompt_length = prompt_ids.size(1)
        completions = torch.tensor(
            [eos_row if i % 2 == 0 else truncated_row for i in range(out.size(0))], dtype=out.dtype, device=out.device
        )
        return torch.cat([out[:, :prompt_length], completions], dim=1)

    model.generate = generate


def tokens_to_eos(completion_ids, eos_token_id: int) -> int:
    """Tokens of each row up to and including its first EOS (the whole row where there is none), summed."""
    total = 0
    for row in completion_ids.tolist():
        total += row.index(eos_token_id) + 1 if eos_token_id in row else len(row)
    return total


def tokens_of_eos_rows(completion_ids, eos_token_id: int) -> int:
    """Tokens, up to and including EOS, of the rows that have an EOS (what ``mask_truncated_completions`` keeps)."""
    return sum(row.index(eos_token_id) + 1 for row in completion_ids.tolist() if eos_token_id in row)
