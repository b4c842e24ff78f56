"""tool-iterations-zero: ``max_tool_calling_iterations=0`` ran the tool loop without limit (TRL 0.27.0 - 1.8.x).

* A real ``GRPOTrainer`` built with ``max_tool_calling_iterations=0``: unpatched, TRL holds
  ``sys.maxsize``; patched (and from 1.9.0), 0. ``None`` stays "no limit" (``sys.maxsize``) and 2
  stays 2 either way.
* Where TRL takes tools (0.29.1 on transformers 5: the ``trl0.29.1-tf5.2.0`` cell), a real GRPO step
  with ``tools=[multiply]`` whose every completion calls the tool (a random tiny model writes none, so
  TRL's ``_tool_call_loop`` is handed a fixed tool-call reply, as ``parse_response`` returns it):
  unpatched, a second generation turn follows the tool result; patched, the first turn is the last.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from packaging.version import Version

import tool_calls
from versions import installed

PID = "tool-iterations-zero"
TRL = installed("trl")
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
TOOL_CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}

needs_setting = pytest.mark.skipif(
    TRL is None or TRL < Version("0.27.0") or not HAVE_TORCH, reason=f"TRL {TRL}: no max_tool_calling_iterations (0.27.0)"
)
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.27.0") <= TRL < Version("1.9.0")) or not HAVE_TORCH, reason=f"TRL {TRL} is outside 0.27.0 - 1.8.x"
)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _limit(tmp_path, value):
    import grpo_run

    return grpo_run.make_trainer(tmp_path, steps=1, max_tool_calling_iterations=value).max_tool_calling_iterations


@needs_bug
def test_bug_without_the_patch_zero_means_no_limit(tmp_path, unpatched):
    with unpatched(PID):
        assert _limit(tmp_path, 0) == sys.maxsize


@needs_setting
def test_zero_means_zero_and_the_rest_is_left_alone(tmp_path):
    assert _limit(tmp_path / "zero", 0) == 0
    assert _limit(tmp_path / "none", None) == sys.maxsize
    assert _limit(tmp_path / "two", 2) == 2


def _tools_or_skip():
    if not HAVE_TORCH or TRL is None or not (Version("0.29.1") <= TRL < Version("1.9.0")):
        pytest.skip(f"TRL {TRL}: a tool run of the token-in/token-out loop, 0.29.1 - 1.8.x")
    import transformers

    if Version(transformers.__version__) < Version("5.0.0"):
        pytest.skip("TRL 0.29.1 - 1.x take tools only on transformers >= 5 (the trl0.29.1-tf5.2.0 cell)")
    pytest.importorskip("jmespath")  # TRL's response parsing for tools


def _generation_turns(tmp_path):
    """One GRPO step with tools and max_tool_calling_iterations=0; how many generation turns it ran."""
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    import chat_templates
    import grpo_run

    tokenizer = chat_templates.make_qwen3_tokenizer()
    tokenizer.response_schema = qwen3_schema  # how TRL parses Qwen3 replies (tool calls)
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": chat_templates.prompt_words(i)}] for i in range(4)]})

    class ToolTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, tools=[multiply], **kwargs)

    trainer = grpo_run.make_trainer(
        tmp_path, steps=1, train_dataset=dataset, processing_class=tokenizer, trainer_cls=ToolTrainer, max_tool_calling_iterations=0
    )
    tool_calls.every_completion_calls(trainer, TOOL_CALL)
    turns = []
    generate = trainer._generate_single_turn

    def counted(*args, **kwargs):
        turns.append(1)
        return generate(*args, **kwargs)

    trainer._generate_single_turn = counted
    trainer.train()
    return len(turns)


def test_bug_without_the_patch_the_tool_result_is_generated_on(tmp_path, unpatched):
    _tools_or_skip()
    with unpatched(PID):
        assert _generation_turns(tmp_path) >= 2


def test_zero_iterations_generate_once(tmp_path):
    _tools_or_skip()
    assert _generation_turns(tmp_path) == 1


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import tool_iterations_zero as patch

    import trl.trainer.grpo_trainer as module

    verdict = patch.probe(module)
    assert verdict.needed is (Version("0.27.0") <= TRL < Version("1.9.0")), verdict


class _Buggy:
    def __init__(self, args):
        self.max_tool_calling_iterations = args.max_tool_calling_iterations or sys.maxsize


class _Fixed:
    def __init__(self, args):
        self.max_tool_calling_iterations = (
            args.max_tool_calling_iterations if args.max_tool_calling_iterations is not None else sys.maxsize
        )


class _Before:
    def __init__(self, args):
        self.tools = args.tools


class _Other:
    def __init__(self, args):
        self.max_tool_calling_iterations = max(args.max_tool_calling_iterations, 1)


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_Before, False), (_Other, None)])
def test_probe_on_code_written_here(cls, needed):
    import types

    from trl_compat.patches import tool_iterations_zero as patch

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
