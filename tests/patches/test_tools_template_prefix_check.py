"""tools-template-prefix-check (TRL 0.29.1 - 1.0.x, tools=[...]): a chat template TRL's old prefix check
refuses though its token-in/token-out tool loop works with it (fixed in 1.1.0 by PR #5458).

The template: Qwen3-like, its generation prompt opening ``<think>`` that a past assistant turn does not
show (as DeepSeek-R1 distills write it; ``tests/support/chat_templates.py``).

* Without the patch (0.29.1 takes tools on transformers 5 only; the 1.0 cell has no jmespath):
  ``GRPOTrainer(..., tools=[tool_calls.multiply])`` raises TRL's ValueError.
* With it: the trainer is built with the template as it is (``chat_template`` None, as 1.1.0 leaves it),
  and a GRPO step where every completion calls the tool appends the tool's result (12) to each.
* A template the tool-call check refuses too still raises; one the old check takes gets TRL's own answer.
* The probe on code written as 0.26 - 0.29.0 (a re-tokenising loop that needs the old check), 0.29.1 - 1.0,
  the main-branch builds with PR #5458 and 1.1.0 write it.
"""

from __future__ import annotations

import importlib.util

import trl_compat
from trl_compat.patches import tools_template_prefix_check as patch_module

import pytest

import tool_calls

PATCH_ID = "tools-template-prefix-check"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
TOOL_CALL = tool_calls.MULTIPLY_CALL

if HAVE_TORCH:
    import chat_templates
    import grpo_run


# -- the probe ---------------------------------------------------------------------------------

OLD_CHECK = """
def is_chat_template_prefix_preserving(tokenizer):
    text1 = tokenizer.apply_chat_template(messages1, tokenize=False, add_generation_prompt=True)
    return text2.startswith(text1) and text3.startswith(text2)
"""
NEW_CHECK = """
def is_chat_template_prefix_preserving(tokenizer):
    dummy_tool_calls = [{"type": "function", "function": {"name": "dummy", "arguments": {}}}]
    return text2.startswith(text1)
"""
TRAINING_TEMPLATE = """
def get_training_chat_template(tokenizer):
    if is_chat_template_prefix_preserving(tokenizer):
        return None
    raise ValueError("The tokenizer's chat template is not prefix-preserving and patching is not supported")
"""
INIT_0_29_0 = """
class GRPOTrainer:
    def __init__(self, tools=None, processing_class=None):
        if tools:
            self.chat_template = get_training_chat_template(processing_class)
"""
SUFFIX_IDS = """
    def _get_tool_suffix_ids(self, tool_messages):
        return []
"""
INIT_1_0 = INIT_0_29_0 + SUFFIX_IDS
INIT_1_1 = (
    """
class GRPOTrainer:
    def __init__(self, tools=None, processing_class=None):
        if tools and not is_chat_template_prefix_preserving(processing_class):
            self.chat_template = get_training_chat_template(processing_class)
"""
    + SUFFIX_IDS
)
BEFORE_TOOLS = """
class GRPOTrainer:
    def __init__(self, processing_class=None):
        self.processing_class = processing_class
"""


@pytest.mark.parametrize(
    "source, verdict",
    [
        (OLD_CHECK + TRAINING_TEMPLATE + INIT_1_0, True),
        (OLD_CHECK + TRAINING_TEMPLATE + INIT_0_29_0, False),
        (NEW_CHECK + TRAINING_TEMPLATE + INIT_1_0, False),
        (NEW_CHECK + TRAINING_TEMPLATE + INIT_1_1, False),
        (BEFORE_TOOLS, False),
        (OLD_CHECK + "\ndef get_training_chat_template(tokenizer):\n    return None\n" + INIT_1_0, None),
    ],
    ids=["0.29.1-1.0", "0.26-0.29.0", "main-with-5458", "1.1.0", "before-0.26", "unknown"],
)
def test_probe_on_written_code(code_module, source, verdict):
    assert patch_module.probe(code_module(source)).needed is verdict


def test_probe_on_the_real_trl():
    pytest.importorskip("trl")
    import trl
    import trl.trainer.grpo_trainer as grpo
    from packaging.version import Version

    release = Version(trl.__version__)
    assert patch_module.probe(grpo).needed is (Version("0.29.1") <= release < Version("1.1.0"))


# -- the checks on tokenizers ---------------------------------------------------------------------


def _needs_torch():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")


def test_the_thinking_template_keeps_a_tool_turn_prefix():
    _needs_torch()
    tokenizer = chat_templates.make_thinking_tokenizer()
    user = [{"role": "user", "content": "dummy"}]
    with_prompt = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    answered = tokenizer.apply_chat_template([*user, {"role": "assistant", "content": "x"}], tokenize=False)
    assert not answered.startswith(with_prompt)  # what TRL's old check asks, and this template does not do
    assert patch_module.keeps_tool_turn_prefix(tokenizer)


def _wrapped_on(template_fn):
    return patch_module._wrap(template_fn)


def test_the_wrapper_keeps_trls_answers_and_its_refusal_of_a_template_failing_both():
    _needs_torch()
    tokenizer = chat_templates.make_thinking_tokenizer()
    tokenizer.chat_template += "{%- if not add_generation_prompt %}{{ 'x' }}{%- endif %}"  # a tail only without a prompt
    assert not patch_module.keeps_tool_turn_prefix(tokenizer)

    def refuses(tokenizer):
        raise ValueError("The tokenizer's chat template is not prefix-preserving and patching is not supported")

    with pytest.raises(ValueError, match="is not prefix-preserving"):
        _wrapped_on(refuses)(tokenizer)
    assert _wrapped_on(refuses)(chat_templates.make_thinking_tokenizer()) is None
    assert _wrapped_on(lambda tokenizer: "TRL's template")(tokenizer=tokenizer) == "TRL's template"

    def other_error(tokenizer):
        raise ValueError("something else")

    with pytest.raises(ValueError, match="something else"):
        _wrapped_on(other_error)(chat_templates.make_thinking_tokenizer())


# -- real trainers ----------------------------------------------------------------------------------


def _window_or_skip():
    _needs_torch()
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401 - the patch's trigger

    version = grpo_run.trl_version()[:3]
    if not (0, 29, 1) <= version < (1, 1, 0):
        pytest.skip("TRL 0.29.1 - 1.0.x only")
    import transformers

    if version < (1, 0, 0) and int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("TRL 0.29.1 takes tools only on transformers >= 5")
    pytest.importorskip("jmespath")  # TRL's response parsing for tools
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()


def _dataset(n=4):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [[{"role": "user", "content": chat_templates.prompt_words(i)}] for i in range(n)]})


def _trainer(tmp_path, completions=None):
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    tokenizer = chat_templates.make_thinking_tokenizer()
    tokenizer.response_schema = qwen3_schema  # how TRL parses Qwen3-style replies (tool calls)

    class ToolTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, tools=[tool_calls.multiply], **kwargs)

    def recording_reward(completions, **kwargs):
        seen.extend(completions)
        return [1.0] * len(completions)

    seen = completions if completions is not None else []
    trainer_kwargs = {"train_dataset": _dataset(), "processing_class": tokenizer, "trainer_cls": ToolTrainer}
    return grpo_run.make_trainer(tmp_path, steps=1, reward_funcs=[recording_reward], **trainer_kwargs)


def test_trainer_refused_without_the_patch(tmp_path, unpatched):
    _window_or_skip()
    with unpatched(PATCH_ID), pytest.raises(ValueError, match="is not prefix-preserving"):
        _trainer(tmp_path)


def test_trainer_built_and_tool_results_appended_with_the_patch(tmp_path):
    _window_or_skip()
    completions: list = []
    trainer = _trainer(tmp_path, completions)
    assert trainer.chat_template is None  # the template as it is, what TRL 1.1.0 decides for it
    tool_calls.every_completion_calls(trainer, TOOL_CALL)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    tool_turns = [[m for m in c if m.get("role") == "tool"] for c in completions]
    assert completions and all(len(turns) == 1 and turns[0]["content"] == "12" for turns in tool_turns), completions
