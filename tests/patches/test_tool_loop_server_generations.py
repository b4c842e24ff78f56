"""tool-loop-server-generations: with tools in server mode, TRL 1.0.0 - 1.14.0 continue only every
num_generations-th history after a tool call, with n=num_generations.

* Every cell with TRL: the probe on the cell's TRL ("needed" on 1.0.0 - 1.14.0) and on code written
  here in the shapes of 1.14.0 (needed), 1.14.1 (passes ``num_generations=1``), 0.26 - 0.29 (the loop
  refuses server mode), a release without the loop, and shapes it does not know (undecided).
* The wrapper: inside the loop the trainer's ``num_generations`` / ``num_generations_eval`` read 1, and
  are restored after it, also after an error.
* TRL 1.0.0 - 1.14.0 taking tools (transformers >= 5; jmespath below transformers 5.13) with vLLM (the
  stand-in): the by-hand cells trl1.10.0 and trl1.12.0 (1.0.0's cell has transformers 4.57, where TRL
  refuses tools; 1.4.0's and 1.9.2's have no jmespath, which TRL < 1.10 asks for): one real GRPO step in server mode, TRL's real
  ``VLLMClient`` on a fake HTTP session (``/generate/`` up to 1.10, ``/v1/completions`` from 1.11),
  2 prompts x 2 generations, every first completion calling the tool (``tool_calls.every_completion_calls``). Unpatched, the post-tool
  request carries histories 0 and 2 only, with n=2, and samples 1 and 3 are continued with tokens the
  server sampled for histories 0 and 2; patched, it carries all 4 histories with n=1 and each sample's
  continuation was sampled for its own history.
* The window's lower bound, in the trl0.29.1-tf5.2.0 cell: the same step raises TRL's
  ``NotImplementedError: Unsupported mode detected`` at the first tool call, before any post-tool request.
"""

from __future__ import annotations

import importlib.util
import inspect
import types

import pytest
from packaging.version import Version

import fake_http
import tool_calls
from versions import installed

PID = "tool-loop-server-generations"
TRL = installed("trl")
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))
BUGGY = TRL is not None and Version("1.0.0") <= TRL < Version("1.14.1")
TOOL_CALL = {"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first integer.
        b: The second integer.
    """
    return a * b


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None and HAVE_TORCH:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


# -- the probe on the cell's TRL and on code written here --------------------------------------------


@pytest.mark.skipif(TRL is None or not HAVE_TORCH, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import tool_loop_server_generations as patch

    import trl.trainer.grpo_trainer as module

    verdict = patch.probe(module)
    assert verdict.needed is BUGGY, verdict


class _Generation:
    def generate(self, prompts, images, num_generations, profiler=None):
        all_prompts = gather_object(prompts)  # noqa: F821 - read, never run
        return self.vllm_client.generate(prompts=all_prompts[::num_generations], n=num_generations)


class _Buggy:  # TRL 1.0.0 - 1.14.0
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        return self.vllm_generation.generate(prompts=prompt_ids, images=images, num_generations=num_generations)

    def _get_tool_suffix_ids(self, tool_messages):
        return []

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        if self.use_vllm and self.vllm_mode == "colocate":
            pass
        return self._generate_single_turn(prompt_ids, images, multimodal_fields)


class _Fixed(_Buggy):  # TRL 1.14.1 on
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, has_tool_images=False):
        return self.vllm_generation.generate(prompts=prompt_ids, images=images, num_generations=num_generations)

    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs, images, multimodal_fields):
        return self._generate_single_turn(prompt_ids, images, multimodal_fields, num_generations=1)


class _Refuses(_Buggy):  # TRL 0.26 - 0.29.x: no server branch in the loop
    def _tool_call_loop(self, prompts, prompt_ids, completion_ids, completions, logprobs):
        if self.use_vllm and self.vllm_mode == "colocate":
            max_model_len = 1
        elif not self.use_vllm:
            max_model_len = 2
        else:
            raise NotImplementedError(f"Unsupported mode detected: use_vllm={self.use_vllm}, vllm_mode={self.vllm_mode}")
        return self._generate_single_turn(prompts, max_model_len)


class _NoLoop:  # TRL < 0.26
    def _generate_single_turn(self, prompts):
        return prompts


class _ReadsTwice(_Buggy):
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
        mode = "train" if self.model.training else "eval"
        num_generations = self.num_generations if mode == "train" else self.num_generations_eval
        self.log(self.num_generations)
        return self.vllm_generation.generate(prompts=prompt_ids, images=images, num_generations=num_generations)


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_Refuses, False), (_NoLoop, False), (_ReadsTwice, None)])
def test_probe_on_code_written_here(cls, needed):
    from trl_compat.patches import tool_loop_server_generations as patch

    verdict = patch.probe(types.SimpleNamespace(GRPOTrainer=cls, VLLMGeneration=_Generation))
    assert verdict.needed is needed, verdict


def test_probe_undecided_without_the_server_path_it_knows():
    from trl_compat.patches import tool_loop_server_generations as patch

    class OtherGeneration:
        def generate(self, prompts, images, num_generations):
            return self.vllm_client.generate(prompts=prompts, n=1)

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=_Buggy, VLLMGeneration=OtherGeneration)).needed is None
    assert patch.probe(types.SimpleNamespace(GRPOTrainer=_Buggy)).needed is None


# -- the wrapper ----------------------------------------------------------------------------------------


def test_wrapper_reads_one_inside_the_loop_and_restores_after():
    from trl_compat.patches import tool_loop_server_generations as patch

    seen = []

    def loop(self, prompts, prompt_ids, fail=False):
        seen.append((self.num_generations, self.num_generations_eval, prompts, prompt_ids))
        if fail:
            raise RuntimeError("a tool loop error")
        return "done"

    wrapped = patch._wrap_loop(loop)
    trainer = types.SimpleNamespace(num_generations=4, num_generations_eval=6)
    assert wrapped(trainer, ["p"], prompt_ids=[[1]]) == "done"
    with pytest.raises(RuntimeError, match="a tool loop error"):
        wrapped(trainer, ["q"], [[2]], fail=True)
    assert seen == [(1, 1, ["p"], [[1]]), (1, 1, ["q"], [[2]])]
    assert (trainer.num_generations, trainer.num_generations_eval) == (4, 6)


# -- a real GRPO step in server mode ---------------------------------------------------------------------


def _response_template():
    """TRL's new-style Qwen3 response template where transformers parses it (>= 5.13) and TRL then takes
    tools without jmespath (1.10+; 1.9 asks for jmespath whatever it parses with), else None."""
    from trl_compat._helpers.source import code

    import trl.chat_template_utils as utils
    import trl.trainer.grpo_trainer as module

    if not getattr(utils, "_SUPPORTS_RESPONSE_TEMPLATE", False):
        return None
    if "not _SUPPORTS_RESPONSE_TEMPLATE and not is_jmespath_available()" not in code(module.GRPOTrainer.__init__):
        return None
    return getattr(utils, "qwen3_template", None)


def _tools_in_server_mode_or_skip(since="1.0.0", before="1.14.1"):
    if not HAVE_TORCH or TRL is None or not (Version(since) <= TRL < Version(before)):
        pytest.skip(f"TRL {TRL}: this test is for TRL {since} up to {before}")
    import transformers

    if Version(transformers.__version__) < Version("5.0.0"):
        pytest.skip("TRL 1.x takes tools only on transformers >= 5 (this cell has an older one)")
    if not _response_template():
        pytest.importorskip("jmespath")  # TRL's legacy response parsing (response_schema) for tools
    import grpo_run

    if not grpo_run.standin_vllm_installed():
        pytest.skip("TRL's server mode needs an importable vllm (the stand-in)")


@pytest.fixture
def server_mode(monkeypatch):
    _tools_in_server_mode_or_skip()
    return fake_http.serve(monkeypatch, fake_http.CompletionServer())


def _tool_step(tmp_path, server):
    """One GRPO step in server mode on ``server``, every first completion calling ``multiply``; returns
    the loop's inputs (prompt ids, first completion ids) and its completion ids after the loop."""
    from datasets import Dataset
    from trl import GRPOTrainer
    from trl.chat_template_utils import qwen3_schema

    import chat_templates
    import grpo_run

    tokenizer = chat_templates.make_qwen3_tokenizer()
    if _response_template() is not None:  # how TRL parses Qwen3 replies (tool calls)
        tokenizer.response_template = _response_template()
    else:
        tokenizer.response_schema = qwen3_schema
    dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": chat_templates.prompt_words(i)}] for i in range(4)]})

    class ToolTrainer(GRPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, tools=[multiply], **kwargs)

    trainer = grpo_run.make_trainer(
        tmp_path,
        steps=1,
        use_vllm="server",
        vllm_server_host="127.0.0.1",
        vllm_server_timeout=1,
        max_completion_length=32,
        train_dataset=dataset,
        processing_class=tokenizer,
        trainer_cls=ToolTrainer,
    )
    assert trainer.vllm_generation.vllm_client.session is server
    tool_calls.every_completion_calls(trainer, TOOL_CALL)
    loop, seen = trainer._tool_call_loop, {}
    signature = inspect.signature(type(trainer)._tool_call_loop.__get__(trainer))  # TRL's own, without self

    def recorded(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        completion_ids = bound.arguments["completion_ids"]
        seen["prompt_ids"] = [list(ids) for ids in bound.arguments["prompt_ids"]]
        seen["first"] = [list(ids) for ids in completion_ids]
        result = loop(*args, **kwargs)
        seen["after"] = [list(ids) for ids in completion_ids]  # TRL's loop updates the list in place
        return result

    trainer._tool_call_loop = recorded
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    return seen


def _histories(server, seen):
    """Each sample's post-tool history (its prompt, its first completion, the tool turn's ids), and,
    per sample, the history the server sampled its post-tool continuation for."""
    assert len(server.requests) == 2, [n for _, n in server.requests]  # the first turn, one post-tool turn
    first_prompts, first_n = server.requests[0]
    assert first_n == 2 and len(first_prompts) == 2  # 2 prompts x 2 generations, as TRL asks in every release
    prefixes = [p + c for p, c in zip(seen["prompt_ids"], seen["first"])]
    assert len({tuple(p) for p in prefixes}) == 4  # every sample's history is its own
    post_prompts, _ = server.requests[1]
    suffix = post_prompts[0][len(prefixes[0]) :]  # the tool turn's ids: the same result (12) for every sample
    assert post_prompts[0][: len(prefixes[0])] == prefixes[0] and suffix
    histories = [prefix + suffix for prefix in prefixes]
    continued_for = []
    for first, after in zip(seen["first"], seen["after"]):
        assert after[: len(first) + len(suffix)] == first + suffix  # TRL keeps the sampled ids, then the tool turn
        continued_for.append(server.sampled_for[tuple(after[len(first) + len(suffix) :])])
    return histories, continued_for


def test_bug_without_the_patch_the_post_tool_turn_continues_other_samples(tmp_path, server_mode, unpatched):
    _tools_in_server_mode_or_skip()
    import trl_compat

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    with unpatched(PID):
        seen = _tool_step(tmp_path, server_mode)
    histories, continued_for = _histories(server_mode, seen)
    post_prompts, post_n = server_mode.requests[1]
    assert post_n == 2
    assert post_prompts == [histories[0], histories[2]]  # histories 1 and 3 never reach the server
    assert continued_for == [tuple(histories[0]), tuple(histories[0]), tuple(histories[2]), tuple(histories[2])]


def test_patched_each_history_is_continued_once(tmp_path, server_mode):
    _tools_in_server_mode_or_skip()
    import trl_compat

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    seen = _tool_step(tmp_path, server_mode)
    histories, continued_for = _histories(server_mode, seen)
    post_prompts, post_n = server_mode.requests[1]
    assert post_n == 1
    assert post_prompts == histories
    assert continued_for == [tuple(h) for h in histories]


def test_before_1_0_the_loop_refuses_server_mode(tmp_path, monkeypatch):
    """The window's lower bound: TRL 0.29.1 takes tools in server mode, and its loop raises before any
    post-tool request (PR #5235, 1.0.0, added the server branch)."""
    _tools_in_server_mode_or_skip("0.29.1", "1.0.0")
    import trl_compat

    server = fake_http.serve(monkeypatch, fake_http.CompletionServer())
    assert trl_compat.status(PID) == trl_compat.NOT_NEEDED, trl_compat.report()
    with pytest.raises(NotImplementedError, match="Unsupported mode detected: use_vllm=True, vllm_mode=server"):
        _tool_step(tmp_path, server)
    assert [n for _, n in server.requests] == [2]  # the first turn only
