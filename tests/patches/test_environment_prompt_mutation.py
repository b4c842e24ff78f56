"""environment-prompt-mutation: the environments loop appended the reset observation to the caller's prompt (TRL 0.29.0 - 1.8.x).

* A real ``GRPOTrainer`` with ``environment_factory`` (TRL takes environments on transformers >= 5.2:
  the ``trl0.29.1-tf5.2.0`` cell) scores the same two examples twice, ``p0``/``p1``, whose
  environments answer ``reset`` with `` OBS``: unpatched, the examples end as ``p0 OBS OBS`` and the
  reward function's prompts on the second call are ``p0 OBS OBS``; patched (and from 1.9.0) the
  examples stay ``p0`` and each call's reward prompts are ``p0 OBS``.
* The wrapper on TRL's loop written here, as 0.29 - 1.0 and 1.8 have it (string and list contents), on
  every cell: the caller's examples untouched, TRL's prompts carry the observation once, a key TRL
  sets on an example still reaches the caller's.
* The probe on the cell's TRL and on code written here.
"""

from __future__ import annotations

import importlib.util
import types

import pytest
from packaging.version import Version

from versions import installed

PID = "environment-prompt-mutation"
TRL = installed("trl")
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


class Env:
    def reset(self, **kwargs):
        return " OBS"

    def noop(self, x: int) -> int:
        """Return the number.

        Args:
            x: a number.
        """
        return x


def _environments_or_skip():
    if not HAVE_TORCH or TRL is None or not (Version("0.29.0") <= TRL < Version("1.9.0")):
        pytest.skip(f"TRL {TRL}: the in-place environments loop is 0.29.0 - 1.8.x")
    import transformers

    if Version(transformers.__version__) < Version("5.2.0"):
        pytest.skip("TRL takes environment_factory only on transformers >= 5.2 (the trl0.29.1-tf5.2.0 cell)")
    pytest.importorskip("jmespath")  # TRL's response parsing for tools


def _score_twice(tmp_path):
    """The same two examples scored twice by a real trainer: (the examples' last contents, each call's reward prompts)."""
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    import chat_templates
    import grpo_run

    tokenizer = chat_templates.make_qwen3_tokenizer()
    tokenizer.response_schema = qwen3_schema
    seen = []

    def reward(prompts, completions, **kwargs):
        seen.append([prompt[-1]["content"] for prompt in prompts])
        return [float(i) for i in range(len(prompts))]

    class EnvTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, environment_factory=Env, **kwargs)

    trainer = grpo_run.make_trainer(
        tmp_path, steps=1, processing_class=tokenizer, trainer_cls=EnvTrainer, reward_funcs=[reward], per_device_train_batch_size=2
    )
    trainer.model.train()
    examples = [{"prompt": [{"role": "user", "content": f"p{i}"}]} for i in range(2)]
    for _ in range(2):
        trainer._generate_and_score_completions(examples)
    return [example["prompt"][-1]["content"] for example in examples], seen


def test_bug_without_the_patch_the_examples_grow(tmp_path, unpatched):
    _environments_or_skip()
    with unpatched(PID):
        contents, seen = _score_twice(tmp_path)
    assert contents == ["p0 OBS OBS", "p1 OBS OBS"]
    assert seen == [["p0 OBS", "p1 OBS"], ["p0 OBS OBS", "p1 OBS OBS"]]


def test_the_examples_are_left_untouched(tmp_path):
    _environments_or_skip()
    contents, seen = _score_twice(tmp_path)
    assert contents == ["p0", "p1"]
    assert seen == [["p0 OBS", "p1 OBS"], ["p0 OBS", "p1 OBS"]]


# TRL's loop as 0.29.0 - 1.0.0 (_Loop029) and 1.8.0 (_Loop18) write it; what TRL generates from is kept.
class _Loop029:
    environments = [Env(), Env()]

    def _generate_and_score_completions(self, inputs):
        prompts = [x["prompt"] for x in inputs]
        if self.environments:
            for prompt, environment, reset_kwargs in zip(prompts, self.environments, inputs, strict=True):
                observation = environment.reset(**reset_kwargs)
                if observation is None:
                    continue
                prompt[-1]["content"] += observation
        inputs[0]["extra"] = "from TRL"
        return [prompt[-1]["content"] for prompt in prompts]


class _Loop18:
    environment_factories = {None: Env}
    environments = [Env(), Env()]

    def _generate_and_score_completions(self, inputs):
        prompts = [x["prompt"] for x in inputs]
        for prompt, environment, x in zip(prompts, self.environments, inputs, strict=True):
            observation = environment.reset(**x)
            if observation is None:
                continue
            if isinstance(observation, list) and isinstance(prompt[-1]["content"], str):
                prompt[-1]["content"] = [{"type": "text", "text": prompt[-1]["content"]}]
            if isinstance(observation, str) and isinstance(prompt[-1]["content"], list):
                observation = [{"type": "text", "text": observation}]
            prompt[-1]["content"] += observation
        return [prompt[-1]["content"] for prompt in prompts]


def _wrapped(cls):
    from trl_compat.patches import environment_prompt_mutation as patch

    return type(cls.__name__, (cls,), {"_generate_and_score_completions": patch._wrap(cls._generate_and_score_completions)})


def test_wrapper_on_the_029_loop_string_contents():
    examples = [{"prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": f"p{i}"}]} for i in range(2)]
    trainer = _wrapped(_Loop029)()
    assert trainer._generate_and_score_completions(examples) == ["p0 OBS", "p1 OBS"]
    assert trainer._generate_and_score_completions(inputs=examples) == ["p0 OBS", "p1 OBS"]
    assert [example["prompt"] for example in examples] == [
        [{"role": "system", "content": "s"}, {"role": "user", "content": f"p{i}"}] for i in range(2)
    ]
    assert examples[0]["extra"] == "from TRL" and "extra" not in examples[1]  # TRL's own writes still reach the caller
    # unwrapped: the bug, on the same code
    assert _Loop029()._generate_and_score_completions(examples) == ["p0 OBS", "p1 OBS"]
    assert [example["prompt"][-1]["content"] for example in examples] == ["p0 OBS", "p1 OBS"]


def test_wrapper_on_the_18_loop_list_contents():
    text = [{"type": "text", "text": "look"}]
    examples = [{"prompt": [{"role": "user", "content": list(text)}]}, {"prompt": [{"role": "user", "content": "p1"}]}]
    trainer = _wrapped(_Loop18)()
    obs = {"type": "text", "text": " OBS"}
    for _ in range(2):
        assert trainer._generate_and_score_completions(examples) == [text + [obs], "p1 OBS"]
    assert examples == [{"prompt": [{"role": "user", "content": text}]}, {"prompt": [{"role": "user", "content": "p1"}]}]


def test_wrapper_leaves_runs_without_environments_alone():
    examples = [{"prompt": [{"role": "user", "content": "p0"}]}]
    seen = []

    class NoEnv:
        environments = None

        def _generate_and_score_completions(self, inputs):
            seen.append(inputs)

    _wrapped(NoEnv)()._generate_and_score_completions(examples)
    assert seen[0] is examples


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import environment_prompt_mutation as patch

    import trl.trainer.grpo_trainer as module

    if not hasattr(module.GRPOTrainer, "_generate_and_score_completions"):
        # the entry's must_exist: the engine reports "not needed" without probing (test_statuses holds it)
        pytest.skip(f"TRL {TRL} has no GRPOTrainer._generate_and_score_completions (it came in 0.16)")
    verdict = patch.probe(module)
    assert verdict.needed is (Version("0.29.0") <= TRL < Version("1.9.0")), verdict


class _Fixed:
    def _generate_and_score_completions(self, inputs):
        prompts = [x["prompt"] for x in inputs]
        for i, (prompt, environment, x) in enumerate(zip(prompts, self.environments, inputs, strict=True)):
            observation = environment.reset(**x)
            content = prompt[-1]["content"]
            prompts[i] = prompt[:-1] + [{**prompt[-1], "content": content + observation}]


class _Before:
    def _generate_and_score_completions(self, inputs):
        return [x["prompt"] for x in inputs]


class _Other:
    def _generate_and_score_completions(self, inputs):
        for x, environment in zip(inputs, self.environments):
            x["prompt"].append({"role": "user", "content": environment.reset(**x)})


@pytest.mark.parametrize("cls,needed", [(_Loop029, True), (_Loop18, True), (_Fixed, False), (_Before, False), (_Other, None)])
def test_probe_on_code_written_here(cls, needed):
    from trl_compat.patches import environment_prompt_mutation as patch

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
