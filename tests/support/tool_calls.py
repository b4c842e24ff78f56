"""Tool-calling GRPO runs with a random tiny model, which writes no tool call of its own."""

from __future__ import annotations

import inspect


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


# the assistant turn's call of :func:`multiply` (3 * 4: the tool's result is "12")
MULTIPLY_CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}


def every_completion_calls(trainer, tool_call: dict) -> None:
    """Hand TRL's ``_tool_call_loop`` (0.26+) one assistant turn calling ``tool_call`` for every
    completion, as ``parse_response`` returns a tool-calling reply; the loop itself runs as TRL wrote it.
    Arguments are bound by name: the loop's signature changes between releases."""
    loop = trainer._tool_call_loop
    signature = inspect.signature(loop)

    def with_tool_calls(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["completions"] = [
            [{"role": "assistant", "content": "", "tool_calls": [tool_call]}] for _ in bound.arguments["completions"]
        ]
        return loop(*bound.args, **bound.kwargs)

    trainer._tool_call_loop = with_tool_calls
