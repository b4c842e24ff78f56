"""Probes read code, not prose: a comment or docstring that names the fixed code's marker
must not turn a buggy (synthetic) TRL into "not needed", nor one that names the buggy
pattern turn fixed code into "needed". Runs in every cell, trl or not."""

import importlib.util
import sys
import textwrap
import types
import uuid

from trl_compat._helpers import zero3
from trl_compat.patches import (
    transformers5_use_cache,
    transformers5_warnings_issued,
    vllm_lora_names,
    vllm_prefix_cache,
    zero3_hooks_api,
    zero3_unwrap,
)

import pytest


def load(tmp_path, text):
    name = "tcprose_" + uuid.uuid4().hex[:8]
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(text))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prefix_cache_reset_named_only_in_prose_is_still_needed(tmp_path):
    module = load(
        tmp_path,
        '''
        """Upstream later calls reset_prefix_cache after every sync."""

        class GRPOTrainer:
            def __init__(self):
                # TODO: self.llm.reset_prefix_cache() after each weight sync
                self.llm = LLM(enable_prefix_caching=True)

            def _move_model_to_vllm(self):
                """Unlike TRL 0.16 this does not call reset_prefix_cache()."""
                load_weights(sd)
    ''',
    )
    verdict = vllm_prefix_cache.probe(module)
    assert verdict.needed is True, verdict.reason


def test_lora_names_prefix_strip_named_only_in_a_comment_is_still_needed(tmp_path):
    module = load(
        tmp_path,
        """
        class GRPOTrainer:
            def _move_model_to_vllm(self):
                # PR #2725 will do k.removeprefix("base_model.model.") here
                llm_model.load_weights(state_dict.items())
    """,
    )
    verdict = vllm_lora_names.probe(module)
    assert verdict.needed is True, verdict.reason


def test_hooks_api_new_name_in_a_comment_is_still_needed(tmp_path, monkeypatch):
    module = load(
        tmp_path,
        '''
        def add_hooks(model):
            """DeepSpeed >= 0.16.4 calls this _register_deepspeed_module."""
            optimizer_offload = model.optimizer.parameter_offload
            # newer TRL: optimizer_offload._register_deepspeed_module(optimizer_offload.module)
            optimizer_offload._register_hooks_recursively(optimizer_offload.module)
    ''',
    )
    renamed = type("DeepSpeedZeRoOffload", (), {zero3_hooks_api.NEW: lambda self, module: None})
    monkeypatch.setattr(zero3, "offload_class", lambda: renamed)
    verdict = zero3_hooks_api.probe(module)
    assert verdict.needed is True, verdict.reason


def test_unwrap_guard_in_a_comment_is_still_needed(tmp_path):
    module = load(
        tmp_path,
        """
        def remove_hooks(model):
            # TRL 0.15: if not hasattr(model, "optimizer"): return
            optimizer_offload = model.optimizer.parameter_offload
    """,
    )
    verdict = zero3_unwrap.probe(module)
    assert verdict.needed is True and "without a guard" in verdict.reason, verdict.reason


def test_unwrap_bare_call_in_a_comment_is_not_needed(tmp_path, monkeypatch):
    utils = load(
        tmp_path,
        """
        def remove_hooks(model):
            if not hasattr(model, "optimizer"):
                return
    """,
    )
    grpo = load(
        tmp_path,
        """
        class GRPOTrainer:
            def _move_model_to_vllm(self):
                # was: with unwrap_model_for_generation(self.model, self.accelerator) as m:
                with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as m:
                    pass
    """,
    )
    monkeypatch.setitem(sys.modules, "trl.trainer.grpo_trainer", grpo)
    verdict = zero3_unwrap.probe(utils)
    assert verdict.needed is False, verdict.reason


def test_unwrap_bare_call_in_code_is_needed(tmp_path, monkeypatch):
    utils = load(
        tmp_path,
        """
        def remove_hooks(model):
            if not hasattr(model, 'optimizer'):
                return
    """,
    )
    grpo = load(
        tmp_path,
        """
        class GRPOTrainer:
            def _move_model_to_vllm(self):
                with unwrap_model_for_generation(
                    self.model, self.accelerator
                ) as m:
                    pass
    """,
    )
    monkeypatch.setitem(sys.modules, "trl.trainer.grpo_trainer", grpo)
    verdict = zero3_unwrap.probe(utils)
    assert verdict.needed is True and "unwraps self.model" in verdict.reason, verdict.reason


def test_transformers5_patterns_only_in_prose_are_not_needed(tmp_path):
    module = load(
        tmp_path,
        '''
        class GRPOTrainer:
            def __init__(self, model, args):
                """Older TRL passed model_init_kwargs.get("use_cache") to
                AutoModelForCausalLM.from_pretrained( and set model.warnings_issued[...]."""
                # model.warnings_issued["estimate_tokens"] = True  (removed: transformers 5)
                self.model = model
    ''',
    )
    verdict = transformers5_use_cache.probe(module)
    assert verdict.needed is False and "does not pass" in verdict.reason, verdict.reason
    verdict = transformers5_warnings_issued.probe(module)
    assert verdict.needed is False and "does not touch" in verdict.reason, verdict.reason


@pytest.mark.every_cell  # reads the installed stack
def test_transformers5_warnings_issued_in_code_is_seen(tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    module = load(
        tmp_path,
        """
        class GRPOTrainer:
            def __init__(self, model):
                model.warnings_issued["estimate_tokens"] = True
    """,
    )
    verdict = transformers5_warnings_issued.probe(module)
    assert verdict.needed is not None and "warnings_issued" in verdict.reason  # the code was read: it was judged
    assert verdict.reason != "GRPOTrainer.__init__ does not touch model.warnings_issued"


def test_a_class_built_at_run_time_is_undecided_with_the_reason():
    from trl_compat._helpers.source import SourceUnavailable

    module = types.ModuleType("tcprose_runtime")
    exec("class GRPOTrainer:\n    def _move_model_to_vllm(self):\n        pass\n", vars(module))
    with pytest.raises(SourceUnavailable):
        vllm_prefix_cache.probe(module)  # the engine reports it "undecided" (tests/engine/test_source.py)
