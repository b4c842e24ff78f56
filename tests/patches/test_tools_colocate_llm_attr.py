"""tools-colocate-llm-attr (TRL 0.28.0 - 0.29.0): the tool loop reads ``self.llm`` but the colocated
engine lives at ``self.vllm_generation.llm``.

Real GRPO steps with ``tools=[tool_calls.multiply]`` and ``vllm_mode="colocate"`` on the vLLM stand-in. A
random tiny model writes no tool call (and on transformers < 5 TRL 0.28 parses none), so the test
hands TRL's ``_tool_call_loop`` a fixed tool-call completion for every sample, as
``parse_response`` returns it on transformers 5. Unpatched: the AttributeError; patched: the loop
reads the stand-in's ``max_model_len`` (the engine's model_config is watched) and the step ends.
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

import tool_calls

PID = "tools-colocate-llm-attr"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
MAX_MODEL_LEN = 96

if HAVE_TORCH:
    import grpo_run
    import tiny


TOOL_CALL = tool_calls.MULTIPLY_CALL


def _trl_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    return grpo_run.trl_version()[:3]


def _window_or_skip():
    version = _trl_or_skip()
    if not (0, 28, 0) <= version < (0, 29, 1):
        pytest.skip("the tool loop reads self.llm in TRL 0.28.0 - 0.29.0 only")
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        pytest.skip("TRL 0.28 / 0.29.0 take tools only on transformers >= 5 (cell trl0.28.0-tf5.2.0)")
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()


def _dataset(n=4):
    from datasets import Dataset

    words = tiny.vocab_words()
    return Dataset.from_dict(
        {"prompt": [[{"role": "user", "content": " ".join(words[i * 7 + j] for j in range(4))}] for i in range(n)]}
    )


class _WatchedConfig:
    """The engine's model_config, counting reads of max_model_len."""

    def __init__(self, config):
        self._config = config
        self.reads = []

    def __getattr__(self, name):
        value = getattr(self._config, name)
        if name == "max_model_len":
            self.reads.append(value)
        return value


def _trainer(tmp_path):
    from trl.chat_template_utils import qwen3_chat_template

    tokenizer = tiny.make_tokenizer()
    tokenizer.chat_template = qwen3_chat_template  # a template TRL knows a response schema for
    trainer = grpo_run.make_trainer(
        tmp_path,
        use_vllm=True,
        steps=1,
        train_dataset=_dataset(),
        processing_class=tokenizer,
        vllm_max_model_length=MAX_MODEL_LEN,
        trainer_cls=_with_tools(),
    )
    config = _WatchedConfig(trainer.vllm_generation.llm.llm_engine.model_config)
    trainer.vllm_generation.llm.llm_engine.model_config = config

    tool_calls.every_completion_calls(trainer, TOOL_CALL)
    return trainer, config


def _with_tools():
    from trl import GRPOTrainer

    class ToolTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, tools=[tool_calls.multiply], **kwargs)

    return ToolTrainer


def test_bug_reproduced_without_the_patch(tmp_path, unpatched):
    _window_or_skip()
    with unpatched(PID):
        trainer, config = _trainer(tmp_path)
        with pytest.raises(AttributeError, match="object has no attribute 'llm'"):
            trainer.train()
    assert config.reads == []


def test_patched_tool_loop_reads_the_engines_max_model_len(tmp_path):
    _window_or_skip()
    trainer, config = _trainer(tmp_path)
    trainer.train()
    assert trainer.state.global_step == 1
    assert grpo_run.finite_losses(trainer.state.log_history)
    assert config.reads and set(config.reads) == {MAX_MODEL_LEN}
    assert trainer.llm is trainer.vllm_generation.llm


def test_probe_on_the_installed_trl():
    version = _trl_or_skip()
    from trl_compat.patches import tools_colocate_llm_attr as patch

    from trl.trainer import grpo_trainer

    if not hasattr(grpo_trainer.GRPOTrainer, "_tool_call_loop"):
        pytest.skip("no tool loop in this TRL")
    expected = True if (0, 28, 0) <= version < (0, 29, 1) else False
    assert patch.probe(grpo_trainer).needed is expected


def test_property_keeps_hasattr_and_assignment():
    _trl_or_skip()
    from trl_compat.patches.tools_colocate_llm_attr import _llm, _set_llm

    class Trainer:
        llm = property(_llm, _set_llm)

    bare = Trainer()
    assert not hasattr(bare, "llm")  # no engine: AttributeError, as without the patch
    bare.vllm_generation = type("G", (), {"llm": "engine"})()
    assert bare.llm == "engine"
    bare.llm = "own"
    assert bare.llm == "own"
