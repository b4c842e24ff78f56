"""tools-empty-list-template (TRL 0.26.0, 0.28.0 - 0.29.1): a run without tools hands the chat
template ``tools=[]``, and a Llama-3.x-style template (``tools is not none``) writes its tool-calling
boilerplate into every prompt.

Real GRPO steps on conversational prompts, no tools, with a Llama-3.1-like tokenizer built in code
(tests/support/chat_templates.py). The prompt ids the loss is computed on are compared by value with
the template's rendering: unpatched, those of ``tools=[]`` (the boilerplate ids in every prompt);
patched, those of ``tools=None``. With the vLLM stand-in (colocate), the texts the engine was
asked to render are checked the same way (0.26.0 and 0.28.x render the chat in vLLM; 0.29 sends ids).
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest

PID = "tools-empty-list-template"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import chat_templates
    import grpo_run
    import tiny


def _trl_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    return grpo_run.trl_version()[:3]


def _affected(version) -> bool:
    return version == (0, 26, 0) or (0, 28, 0) <= version < (1, 0, 0)


def _window_or_skip():
    version = _trl_or_skip()
    if not _affected(version):
        pytest.skip("TRL turns tools=None into [] in 0.26.0 and 0.28.0 - 0.29.1 only")
    # in these cells the patch must be on: a switched-off patch fails here, it does not skip
    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()
    return version


def _messages(i):
    return [{"role": "user", "content": chat_templates.prompt_words(i)}]


def _dataset(n=4):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": [_messages(i) for i in range(n)]})


def _rendered(tokenizer, tools, n=4):
    """The prompt ids the template gives each prompt, with ``tools`` as given."""
    return {
        tuple(tokenizer.apply_chat_template(_messages(i), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False))
        for i in range(n)
    }


def _boilerplate_ids(tokenizer):
    return set(tokenizer.convert_tokens_to_ids(list(chat_templates.BOILERPLATE)))


def _run(tmp_path, use_vllm=False):
    tokenizer = chat_templates.make_llama31_tokenizer()
    # vLLM renders chats with the checkpoint's tokenizer (0.26.0, 0.28.x): save this one with the model
    model = tiny.save_tiny(tmp_path / "model", "qwen2", tokenizer=tokenizer)
    trainer = grpo_run.make_trainer(
        tmp_path, model=model, use_vllm=use_vllm, steps=1, train_dataset=_dataset(), processing_class=tokenizer
    )
    seen = grpo_run.spy_training_prompt_ids(trainer)
    tools_after_init = getattr(trainer, "tools", "missing")
    trainer.train()
    assert trainer.state.global_step == 1 and grpo_run.finite_losses(trainer.state.log_history)
    return tokenizer, trainer, seen, tools_after_init


def test_template_renders_boilerplate_for_an_empty_list():
    """The template itself (what Meta's Llama 3.x templates do): [] is "tools", None is not."""
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    tokenizer = chat_templates.make_llama31_tokenizer()
    boilerplate = _boilerplate_ids(tokenizer)
    assert tokenizer.unk_token_id not in boilerplate
    with_list, without = _rendered(tokenizer, []), _rendered(tokenizer, None)
    assert with_list.isdisjoint(without)
    assert all(boilerplate <= set(ids) for ids in with_list)
    assert all(boilerplate.isdisjoint(ids) for ids in without)
    assert all(len(a) == len(b) + len(boilerplate) for a, b in zip(sorted(with_list), sorted(without)))


def test_bug_reproduced_without_the_patch(tmp_path, unpatched):
    _window_or_skip()
    with unpatched(PID):
        tokenizer, _, seen, tools = _run(tmp_path)
    assert tools == []
    assert seen and seen <= _rendered(tokenizer, []), "the loss's prompts are not the template's rendering with tools=[]"
    assert all(_boilerplate_ids(tokenizer) <= set(ids) for ids in seen)


def test_patched_prompts_carry_no_tool_boilerplate(tmp_path):
    _window_or_skip()
    tokenizer, trainer, seen, tools = _run(tmp_path)
    assert tools is None and trainer.tools is None
    assert seen and seen <= _rendered(tokenizer, None)
    assert all(_boilerplate_ids(tokenizer).isdisjoint(ids) for ids in seen)


def _vllm_or_skip():
    version = _window_or_skip()
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    return version


def _engine_texts(trainer):
    llm = grpo_run.trainer_llm(trainer)
    return [text for call in getattr(llm, "received_chat_prompts", []) for text in call]


@pytest.mark.parametrize("patched", [False, True], ids=["unpatched", "patched"])
def test_colocated_vllm_prompts(tmp_path, unpatched, patched):
    """0.26.0 / 0.28.x hand tools=[] to LLM.chat (0.28: through VLLMGeneration.tools); 0.29 sends the
    trainer's ids: either way, what vLLM generates from carries the boilerplate unpatched only."""
    _vllm_or_skip()
    if patched:
        tokenizer, trainer, seen, _ = _run(tmp_path, use_vllm=True)
    else:
        with unpatched(PID):
            tokenizer, trainer, seen, _ = _run(tmp_path, use_vllm=True)
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and "tools" in vars(generation):
        assert (generation.tools is None) is patched
    assert seen and seen <= _rendered(tokenizer, None if patched else [])
    texts = _engine_texts(trainer)
    assert texts or grpo_run.trl_version()[:2] >= (0, 29)  # 0.29 sends ids, not chats
    assert all(("Environment: ipython" in text) is not patched for text in texts), texts


def test_probe_on_the_installed_trl():
    version = _trl_or_skip()
    from trl_compat.patches import tools_empty_list_template as patch

    from trl.trainer import grpo_trainer

    assert patch.probe(grpo_trainer).needed is _affected(version), patch.probe(grpo_trainer)


@pytest.mark.parametrize(
    "init, call, verdict",
    [
        ("self.tools = tools or []", "x.apply_chat_template(p, tools=self.tools, add_generation_prompt=True)", True),  # 0.26.0 / 0.28
        ("self.tools = tools", "x.apply_chat_template(p, tools=self.tools, add_generation_prompt=True)", False),  # 0.26.1 - 0.27
        ("tools = tools or []\n        self.tools = tools", "x.apply_chat_template(p, tools=self.tools or None)", False),  # 1.0.0
        ("self.tools = tools or []", "x.apply_chat_template(p, tools=list(self.tools))", None),  # unknown shape
    ],
)
def test_probe_reads_the_module_source(code_module, init, call, verdict):
    _trl_or_skip()

    from trl_compat.patches import tools_empty_list_template as patch

    module = code_module(
        "class GRPOTrainer:\n"
        f"    def __init__(self, tools=None):\n        {init}\n\n"
        f"    def _tokenize(self, x, p):\n        return {call}\n"
    )
    assert patch.probe(module).needed is verdict
