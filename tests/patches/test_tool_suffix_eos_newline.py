"""tool-suffix-eos-newline (TRL 0.29.1 on transformers >= 5, tools=[...]): the ids TRL puts between a
completion and its tool result lose what a Qwen3-style template writes after ``<|im_end|>`` (its
newline).

A Qwen3-like tokenizer built in code (tests/support/chat_templates.py): ``<|im_end|>`` is the EOS and
the template writes ``<|im_end|>\\n`` after every turn, the newline a token of its own.

* By value, on TRL's own ``GRPOTrainer._get_tool_suffix_ids``: the suffix must be what the template
  writes for ``assistant-turn-end + tool turn + next header`` after the EOS, starting with the
  newline; unpatched it starts with ``<|im_start|>``.
* A real GRPO step with ``tools=[tool_calls.multiply]`` on transformers generation. A random tiny model writes
  no tool call, so TRL's ``_tool_call_loop`` is handed a fixed tool-call completion for every sample
  (as ``parse_response`` returns it). The ids the second turn is generated from are checked:
  ``prompt + completion`` then the template's suffix, the newline first.

TRL 0.29.1 refuses tools on transformers < 5: these tests run in a cell with TRL 0.29.1 and
transformers 5 (``trl0.29.1-tf5.2.0``); elsewhere they skip, and the probe test runs everywhere.
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

import tool_calls

PID = "tool-suffix-eos-newline"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
TOOL_CALL = tool_calls.MULTIPLY_CALL
TOOL_MESSAGES = [{"role": "tool", "name": "multiply", "content": "12"}]

if HAVE_TORCH:
    import chat_templates
    import grpo_run


def _trl_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    return grpo_run.trl_version()[:3]


def _window_or_skip():
    version = _trl_or_skip()
    from trl.trainer import grpo_trainer

    if not hasattr(grpo_trainer.GRPOTrainer, "_get_tool_suffix_ids") or version >= (1, 0, 0):
        pytest.skip("TRL builds tool turns from ids with the EOS-only prefix bug in 0.29.1 only")
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("TRL 0.29.1 takes tools only on transformers >= 5 (a cell trl0.29.1-tf5.x)")
    pytest.importorskip("jmespath")  # TRL's response parsing for tools
    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    return version


def _ids(tokenizer, *tokens):
    return tokenizer.convert_tokens_to_ids(list(tokens))


def _template_suffix(tokenizer):
    """What the template writes after an assistant turn's EOS, for the tool turn and the next header."""
    messages = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "dummy"}]
    full = tokenizer.apply_chat_template(messages + TOOL_MESSAGES, add_generation_prompt=True, tokenize=True, return_dict=False)
    before_tool = full.index(tokenizer.convert_tokens_to_ids("<tool_response>"))
    eos = max(i for i in range(before_tool) if full[i] == tokenizer.eos_token_id)
    return list(full[eos + 1 :])


def _dataset(n=4):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": chat_templates.prompt_words(i)}] for i in range(n)]})


def _trainer(tmp_path):
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    tokenizer = chat_templates.make_qwen3_tokenizer()
    tokenizer.response_schema = qwen3_schema  # how TRL parses Qwen3 replies (tool calls)

    class ToolTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, tools=[tool_calls.multiply], **kwargs)

    trainer = grpo_run.make_trainer(tmp_path, steps=1, train_dataset=_dataset(), processing_class=tokenizer, trainer_cls=ToolTrainer)
    tool_calls.every_completion_calls(trainer, TOOL_CALL)
    turns = []  # (the ids each generation starts from, the completion ids it returns)
    generate = trainer._generate_single_turn

    def spy(prompt_ids, *args, **kwargs):
        out = generate(prompt_ids, *args, **kwargs)
        turns.append(([list(ids) for ids in prompt_ids], [list(ids) for ids in out[0]]))
        return out

    trainer._generate_single_turn = spy
    return tokenizer, trainer, turns


def _suffixes(turns):
    """The ids between each first-turn prompt+completion and the second turn's generation."""
    (prompts, completions), (second, _) = turns[0], turns[1]
    firsts = [p + c for p, c in zip(prompts, completions)]
    suffixes = []
    for ids in second:
        first = next(f for f in firsts if ids[: len(f)] == f)
        suffixes.append(ids[len(first) :])
    return suffixes


def test_template_writes_a_newline_after_eos():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    tokenizer = chat_templates.make_qwen3_tokenizer()
    assert tokenizer.eos_token == "<|im_end|>"
    suffix = _template_suffix(tokenizer)
    assert suffix[:3] == _ids(tokenizer, "\n", "<|im_start|>", "user")
    assert suffix[-3:] == _ids(tokenizer, "<|im_start|>", "assistant", "\n")


def test_bug_reproduced_without_the_patch(tmp_path, unpatched):
    _window_or_skip()
    with unpatched(PID):
        tokenizer, trainer, turns = _trainer(tmp_path)
        suffix = trainer._get_tool_suffix_ids(TOOL_MESSAGES)
        trainer.train()
    expected = _template_suffix(tokenizer)
    assert suffix == expected[1:], "TRL 0.29.1 keeps the template's newline after EOS"
    assert suffix[0] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert len(turns) >= 2 and _suffixes(turns) and all(s[: len(expected) - 1] == expected[1:] for s in _suffixes(turns))


def test_patched_suffix_keeps_the_newline_after_eos(tmp_path):
    _window_or_skip()
    tokenizer, trainer, turns = _trainer(tmp_path)
    expected = _template_suffix(tokenizer)
    assert trainer._get_tool_suffix_ids(TOOL_MESSAGES) == expected
    trainer.train()
    assert trainer.state.global_step == 1 and grpo_run.finite_losses(trainer.state.log_history)
    suffixes = _suffixes(turns)
    assert len(turns) >= 2 and suffixes
    assert all(s[: len(expected)] == expected for s in suffixes), (suffixes, expected)
    assert all(s[0] == tokenizer.convert_tokens_to_ids("\n") for s in suffixes)


def test_probe_on_the_installed_trl():
    version = _trl_or_skip()
    from trl_compat.patches import tool_suffix_eos_newline as patch

    from trl.trainer import grpo_trainer

    assert patch.probe(grpo_trainer).needed is ((0, 29, 1) <= version < (1, 0, 0)), patch.probe(grpo_trainer)


_SUFFIX_029 = (
    "    def _get_tool_suffix_ids(self, tool_messages):\n"
    "        prefix_ids = self.processing_class.apply_chat_template(d, return_dict=False)\n"
    "        full_ids = self.processing_class.apply_chat_template(d + tool_messages, return_dict=False)\n"
    "{fix}"
    "        return full_ids[len(prefix_ids) :]\n"
)
_FIX_100 = (
    "        last_eos_idx = max(i for i, t in enumerate(prefix_ids) if t == self.eos_token_id)\n"
    "        prefix_ids = prefix_ids[: last_eos_idx + 1]\n"
)


@pytest.mark.parametrize(
    "body, verdict",
    [
        (_SUFFIX_029.format(fix=""), True),  # 0.29.1
        (_SUFFIX_029.format(fix=_FIX_100), False),  # 1.0.0 (PR #5330)
        ("    def _tool_call_loop(self):\n        pass\n", False),  # re-tokenising releases
        ("    def _get_tool_suffix_ids(self, tool_messages):\n        return self.suffix(tool_messages)\n", None),
    ],
)
def test_probe_reads_the_module_source(code_module, body, verdict):
    _trl_or_skip()

    from trl_compat.patches import tool_suffix_eos_newline as patch

    module = code_module(f"class GRPOTrainer:\n{body}")
    assert patch.probe(module).needed is verdict
