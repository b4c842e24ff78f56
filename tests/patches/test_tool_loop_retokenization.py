"""tool-loop-retokenization (TRL 0.26.0 - 0.29.0 with tools): reported "undecided", never applied.

* The probe on the installed TRL: "undecided" naming TRL 0.29.1 where ``_tool_call_loop``
  re-tokenises (0.26.0 - 0.29.0), "not needed" without a tool loop (< 0.26) or with the fix
  (``_get_tool_suffix_ids``, 0.29.1); and on code written here. ``apply`` refuses.
* On transformers 4 (the 0.26 / 0.28 cells) tools cannot be used at all: ``GRPOTrainer(tools=[...])``
  raises TRL's ImportError, which is why the window requires transformers >= 5.
* On transformers >= 5 with TRL 0.26.0 - 0.29.0 (no matrix cell yet: a venv made by hand), a real GRPO
  step with a tool and a code-built byte-level BPE tokenizer whose chat template supports tools. The
  model's ``generate`` is stubbed (the tiny model samples noise) to return a tool call spelled one
  byte per token: re-encoding merges the bytes, so the re-tokenised completion is far shorter than
  the sampled one. By value: the ids TRL keeps for the completion are not the sampled ones, and the
  step fails with ``The size of tensor a (...) must match the size of tensor b (...)``.
"""

import importlib
import importlib.util
import os
import re

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat

from packaging.version import Version

from versions import installed

PID = "tool-loop-retokenization"
TRL = installed("trl")
TRANSFORMERS = installed("transformers")
LOOP = TRL is not None and Version("0.26.0") <= TRL < Version("0.29.1")
TF5 = TRANSFORMERS is not None and TRANSFORMERS >= Version("5.0.0.dev0")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
# the matrix cells of TRL 0.26 - 0.29.0 on transformers 5 switch it off (tox.ini): "undecided" stops strict runs
SWITCHED_OFF = PID in {i.strip() for i in os.environ.get("TRL_COMPAT_DISABLE", "").split(",")}
loop_on_tf4 = pytest.mark.skipif(not LOOP or TF5, reason=f"TRL {TRL} x transformers {TRANSFORMERS}: not a tool loop on transformers 4")
# TRL's tools need jmespath (trl0.28.0-tf5.2.0 has it; trl0.27.1-tf5.1.0, a cell for another bug, does not)
JMESPATH = importlib.util.find_spec("jmespath") is not None
loop_on_tf5 = pytest.mark.skipif(
    not LOOP or not TF5 or not JMESPATH,
    reason=f"TRL {TRL} x transformers {TRANSFORMERS} (jmespath: {JMESPATH}): the re-tokenising tool loop: 0.26.0 - 0.29.0, "
    "transformers 5, jmespath",
)
# 0.29.1's fixed loop; TRL 1.x parses tool calls with a response_template this test's tokenizer lacks
fixed_on_tf5 = pytest.mark.skipif(
    TRL is None or not Version("0.29.1") <= TRL < Version("1.0") or not TF5 or not JMESPATH,
    reason=f"TRL {TRL} x transformers {TRANSFORMERS}: not 0.29.x's fixed tool loop on transformers 5",
)


def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


@needs_trl
def test_probe_on_the_installed_trl():
    from trl_compat.patches import tool_loop_retokenization as tlr

    verdict = tlr.probe(importlib.import_module("trl.trainer.grpo_trainer"))
    if LOOP:
        assert verdict.needed is None and "TRL >= 0.29.1" in verdict.reason and "must match" in verdict.reason, verdict
    elif TRL < Version("0.26.0"):
        assert verdict.needed is False and "no tool-calling loop" in verdict.reason, verdict
    else:
        assert verdict.needed is False and "PR #5242" in verdict.reason, verdict


@needs_trl
def test_status_is_never_applied():
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    status = trl_compat.status(PID)
    if SWITCHED_OFF:
        assert status == trl_compat.DISABLED, trl_compat.report()
    else:
        assert status == (trl_compat.UNDECIDED if LOOP and TF5 else trl_compat.NOT_NEEDED), trl_compat.report()


def test_apply_refuses():
    from trl_compat.patches import tool_loop_retokenization as tlr

    with pytest.raises(NotImplementedError, match="use TRL >= 0.29.1"):
        tlr.apply(None, None)


def _trainer(tmp_path, tokenizer, dataset, **config):
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    args, _ = grpo_run.make_config(tmp_path / "out", steps=1, **config)
    path = tiny.save_tiny(tmp_path / "model", "qwen2", tokenizer=tokenizer)
    return GRPOTrainer(
        model=path, reward_funcs=[tiny.varying_reward], args=args, train_dataset=dataset, processing_class=tokenizer, tools=[add]
    )


@loop_on_tf4
def test_tools_need_transformers_5_in_this_window(tmp_path):
    import tiny

    with pytest.raises(ImportError, match="requires transformers version 5.0.0"):
        _trainer(tmp_path, tiny.make_llama3_tokenizer(), tiny.prompt_dataset(4))


@pytest.mark.parametrize(
    "body, verdict",
    [
        # 0.26.0 - 0.29.0
        (
            "def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs):\n"
            "        return self.processing_class.apply_chat_template(prompts, tokenize=True)\n",
            None,
        ),
        # 0.29.1
        (
            "def _get_tool_suffix_ids(self, tool_messages):\n        return []\n"
            "    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs):\n"
            "        return prompt_ids[0] + completion_ids[0] + self._get_tool_suffix_ids([])\n",
            False,
        ),
        # < 0.26: no tools
        ("def _generate(self, prompts):\n        return prompts\n", False),
    ],
)
def test_probe_reads_the_code(code_module, body, verdict):
    from trl_compat.patches import tool_loop_retokenization as tlr

    module = code_module(f"class GRPOTrainer:\n    {body}")
    assert tlr.probe(module).needed is verdict


# -- transformers >= 5: the bug by value --------------------------------------------------------

SPECIALS = ("<|pad|>", "<|im_end|>", "<|im_start|>")
# Prefix-preserving, renders tool calls and tool results; no whitespace control, so every "\n" stays.
TOOL_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'assistant' %}<|im_start|>assistant\n{{ m['content'] }}"
    "{% if m['tool_calls'] is defined and m['tool_calls'] %}{% for tc in m['tool_calls'] %}"
    "<tool_call>\n{{ tc['function'] | tojson }}\n</tool_call>{% endfor %}{% endif %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
QUESTIONS = ("What is 1 plus 2?", "Add 1 and 2.", "What is one plus two?", "Sum 1 and 2.")


def _bpe_tokenizer():
    """A byte-level BPE tokenizer trained in code on the tool-call texts (so re-encoding merges bytes),
    with the tool template and TRL's Qwen3 response schema (how TRL parses tool calls)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from trl.chat_template_utils import qwen3_schema

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=list(SPECIALS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    corpus = [TOOL_CALL, "The answer is 3.", "user tool assistant", *QUESTIONS] * 20
    backend.train_from_iterator(corpus, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in ("<tool_call>", "</tool_call>")])
    tokenizer.padding_side = "left"
    tokenizer.chat_template = TOOL_TEMPLATE
    tokenizer.response_schema = qwen3_schema
    assert len(tokenizer) <= 512  # the tiny model's vocabulary
    return tokenizer


def _byte_ids(tokenizer, text):
    """``text`` one byte per token (what a model may sample), the tool-call tags as their own ids."""
    ids = []
    for i, part in enumerate(text.split("<tool_call>")):
        if i:
            ids.append(tokenizer.convert_tokens_to_ids("<tool_call>"))
        for j, piece in enumerate(part.split("</tool_call>")):
            if j:
                ids.append(tokenizer.convert_tokens_to_ids("</tool_call>"))
            ids += [tokenizer(ch, add_special_tokens=False)["input_ids"][0] for ch in piece]
    return ids


def _tool_step(tmp_path):
    """One GRPO step whose model "samples" the tool call byte by byte, then the answer. Returns what
    _tool_call_loop got and gave back, the stubbed generate calls, the ids, and the error raised."""
    import inspect

    import torch
    from datasets import Dataset

    tokenizer = _bpe_tokenizer()
    sampled = _byte_ids(tokenizer, TOOL_CALL) + [tokenizer.eos_token_id]
    assert tokenizer.decode(sampled) == TOOL_CALL + "<|im_end|>"
    reencoded = tokenizer(TOOL_CALL, add_special_tokens=False)["input_ids"]
    assert len(reencoded) < len(sampled) // 2  # decode/encode is not a bijection: BPE merges the bytes
    answer = tokenizer("The answer is 3.", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": q}] for q in QUESTIONS]})
    trainer = _trainer(tmp_path, tokenizer, dataset, max_completion_length=96)
    calls = []

    def generate(*args, **kwargs):
        input_ids = kwargs["input_ids"]
        completion = torch.tensor(sampled if not calls else answer, device=input_ids.device)
        calls.append(input_ids.size(0))
        return torch.cat([input_ids, completion.expand(input_ids.size(0), -1)], dim=1)

    trainer.model.generate = generate
    loop, seen = trainer._tool_call_loop, {}
    signature = inspect.signature(loop)

    def tool_call_loop(*args, **kwargs):
        seen["sampled"] = [list(ids) for ids in signature.bind(*args, **kwargs).arguments["completion_ids"]]
        out = loop(*args, **kwargs)
        seen["tool_mask"], seen["completion_ids"] = out[0], out[2]
        return out

    trainer._tool_call_loop = tool_call_loop
    try:
        trainer.train()
        error = None
    except RuntimeError as exc:
        error = exc
    return seen, calls, sampled, reencoded, answer, error


@loop_on_tf5
def test_bug_tool_loop_scores_retokenised_ids_and_crashes(tmp_path):
    from trl_compat.patches import tool_loop_retokenization as tlr

    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    # the cells with this stack switch the patch off (tox.ini): what it would report is its probe's verdict
    verdict = tlr.probe(importlib.import_module("trl.trainer.grpo_trainer"))
    assert verdict.needed is None and "TRL >= 0.29.1" in verdict.reason, verdict
    seen, calls, sampled, reencoded, answer, error = _tool_step(tmp_path)
    assert error is not None and re.search(r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)", str(error))
    assert calls == [4, 4]  # the tool was called for every completion, then generation went on
    assert seen["sampled"] == [sampled] * 4
    for ids, mask in zip(seen["completion_ids"], seen["tool_mask"]):
        # silent half: the completion the loss scores starts with the re-tokenised tool call, not the sampled ids
        assert ids[: len(reencoded)] == reencoded and ids[: len(sampled)] != sampled
        assert ids[-len(answer) :] == answer
        # crash: tool_mask kept the sampled length, so it outgrows the re-tokenised completion
        assert len(mask) == len(sampled) + len(answer) > len(ids)


@fixed_on_tf5
def test_fixed_release_scores_the_sampled_ids(tmp_path):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    assert trl_compat.status(PID) == trl_compat.NOT_NEEDED
    seen, calls, sampled, reencoded, answer, error = _tool_step(tmp_path)
    assert error is None and calls == [4, 4]
    for ids, mask in zip(seen["completion_ids"], seen["tool_mask"]):
        assert ids[: len(sampled)] == sampled and ids[-len(answer) :] == answer
        assert len(mask) == len(ids) and mask[: len(sampled)] == [1] * len(sampled)
