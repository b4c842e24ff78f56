"""prompt-right-truncation (TRL 0.24.0 - 0.25.1): a passed tokenizer cut long prompts on the right.

* The probe on the installed TRL: "needed" in 0.24.0 - 0.25.1 (tokenizer truncation,
  ``max_length=self.max_prompt_length``), "not needed" before (TRL's own left truncation) and from
  0.26.0 (no truncation); and on code written here.
* A real GRPO run (TRL 0.24 - 0.25 cells, transformers generation path) with a code-built Llama-3-style
  tokenizer and chat template, conversational prompts of 28 ids, ``max_prompt_length=16``. Without the
  patch, the prompt ids ``generate`` receives and those the loss is computed on are the prompt's FIRST
  16 ids: the question's tail and the ``<|start_header_id|>assistant<|end_header_id|>`` generation
  header are cut. With it: its LAST 16 ids, ending with the generation header. A tokenizer the user
  already set to ``truncation_side="left"`` shows that the passed tokenizer's side is what decides.
* The same run around the window (0.20 - 0.23, 0.26+ cells), "not needed": 0.20 - 0.23 keep the last
  16 ids themselves, 0.26+ keep the whole prompt.
"""

import importlib

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat

from packaging.version import Version

from versions import installed

PID = "prompt-right-truncation"
TRL = installed("trl")
IN_WINDOW = TRL is not None and Version("0.24.0") <= TRL < Version("0.26.0")
in_window = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL}: the tokenizer truncates prompts only in 0.24.0 - 0.25.1")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
around_window = pytest.mark.skipif(
    TRL is None or IN_WINDOW or TRL < Version("0.20.0"), reason=f"TRL {TRL}: the runs around the window cover the 0.2x releases"
)

MAX_PROMPT_LENGTH = 16
WORDS = 20  # + BOS, 3 user header ids, EOT, 3 generation header ids = 28 ids


def _tokenizer(side=None):
    import tiny

    tokenizer = tiny.make_llama3_tokenizer()
    assert tokenizer.truncation_side == "right"  # transformers' default: what a user passes
    if side is not None:
        tokenizer.truncation_side = side
    return tokenizer


def _prompts():
    import tiny

    words = tiny.llama3_vocab_words()[3:]
    return [[{"role": "user", "content": " ".join(words[(i * 31 + j * 7) % len(words)] for j in range(WORDS))}] for i in range(4)]


def _full_ids(tokenizer, prompt):
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _header(tokenizer):
    return tokenizer.convert_tokens_to_ids(["<|start_header_id|>", "assistant", "<|end_header_id|>"])


def _run(tmp_path, tokenizer):
    """One GRPO step; the unpadded prompt ids generate() got and those the loss used."""
    from datasets import Dataset

    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path,
        model="llama",
        steps=1,
        processing_class=tokenizer,
        train_dataset=Dataset.from_dict({"prompt": _prompts()}),
        max_prompt_length=MAX_PROMPT_LENGTH,
    )
    generated = set()
    model_generate = trainer.model.generate

    def generate(*args, **kwargs):
        input_ids = kwargs["input_ids"] if "input_ids" in kwargs else args[0]  # 0.20 - 0.23 pass it by position
        for row, mask in zip(input_ids, kwargs["attention_mask"]):
            generated.add(tuple(row[mask.bool()].tolist()))
        return model_generate(*args, **kwargs)

    trainer.model.generate = generate
    scored = grpo_run.spy_training_prompt_ids(trainer)
    trainer.train()
    assert generated and scored
    return trainer, generated, scored


def _expected(tokenizer, keep):
    full = [_full_ids(tokenizer, prompt) for prompt in _prompts()]
    assert all(len(ids) == WORDS + 8 for ids in full)
    return {tuple(ids[:MAX_PROMPT_LENGTH] if keep == "first" else ids[-MAX_PROMPT_LENGTH:]) for ids in full}


@in_window
def test_bug_without_the_patch_prompts_lose_their_end(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    tokenizer = _tokenizer()
    with unpatched(PID):
        trainer, generated, scored = _run(tmp_path, tokenizer)
    assert tokenizer.truncation_side == "right"
    first = _expected(tokenizer, "first")
    assert generated <= first and scored <= first, (generated, scored)
    header = tuple(_header(tokenizer))
    for ids in generated | scored:
        assert ids[0] == tokenizer.bos_token_id and ids[-3:] != header  # the start kept, the generation header cut


@in_window
def test_fix_keeps_the_prompt_end_and_generation_header(tmp_path):
    assert trl_compat.status(PID) == trl_compat.APPLIED
    tokenizer = _tokenizer()
    trainer, generated, scored = _run(tmp_path, tokenizer)
    assert trainer.processing_class is tokenizer and tokenizer.truncation_side == "left"
    last = _expected(tokenizer, "last")
    assert generated <= last and scored <= last, (generated, scored)
    assert generated == scored
    for ids in generated:
        assert list(ids[-3:]) == _header(tokenizer) and len(ids) == MAX_PROMPT_LENGTH


@in_window
def test_tokenizer_side_decides_a_left_tokenizer_needs_no_fix(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    tokenizer = _tokenizer("left")
    with unpatched(PID):
        _, generated, scored = _run(tmp_path, tokenizer)
    last = _expected(tokenizer, "last")
    assert generated <= last and scored <= last


@around_window
def test_releases_around_the_window_keep_the_prompt_end(tmp_path):
    """Why "not needed" there: 0.20 - 0.23 keep the last max_prompt_length ids themselves, 0.26+ truncate nothing."""
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    assert trl_compat.status(PID) == trl_compat.NOT_NEEDED
    tokenizer = _tokenizer()
    _, generated, scored = _run(tmp_path, tokenizer)
    if TRL < Version("0.24.0"):
        expected = _expected(tokenizer, "last")
    else:
        expected = {tuple(_full_ids(tokenizer, prompt)) for prompt in _prompts()}  # whole prompts: 28 ids
    assert generated <= expected and scored <= expected, (generated, scored)
    assert all(list(ids[-3:]) == _header(tokenizer) for ids in generated)


def test_truncate_left_sets_tokenizer_and_processor_tokenizer():
    from types import SimpleNamespace

    from trl_compat.patches import prompt_right_truncation as prt

    tokenizer = _tokenizer()
    assert prt.truncate_left(tokenizer) == ["right"] and tokenizer.truncation_side == "left"
    assert prt.truncate_left(tokenizer) == []
    processor = SimpleNamespace(tokenizer=_tokenizer())
    assert prt.truncate_left(processor) == ["right"] and processor.tokenizer.truncation_side == "left"
    assert prt.truncate_left(None) == []


@needs_trl
def test_probe_on_the_installed_trl():
    from trl_compat.patches import prompt_right_truncation as prt

    verdict = prt.probe(importlib.import_module("trl.trainer.grpo_trainer"))
    assert verdict.needed is IN_WINDOW, verdict
    if TRL < Version("0.24.0"):
        assert "truncates prompts itself" in verdict.reason
    elif TRL >= Version("0.26.0"):
        assert "does not truncate prompts" in verdict.reason


@pytest.mark.parametrize(
    "body, verdict",
    [
        # 0.24.0
        ("def g(self, t):\n        return self.processing_class(text=t, max_length=self.max_prompt_length, truncation=True)\n", True),
        # 0.25.x
        ("def g(self, t):\n        kw = {'max_length': self.max_prompt_length, 'truncation': True}\n", True),
        # a fix that sets the side on any tokenizer
        (
            "def __init__(self, tokenizer):\n        tokenizer.truncation_side = 'left'\n"
            "    def g(self, t):\n        return self.processing_class(text=t, max_length=self.max_prompt_length, truncation=True)\n",
            False,
        ),
        # 0.14 - 0.23: TRL's own left truncation
        ("def g(self, ids):\n        return ids[:, -self.max_prompt_length :]\n", False),
        # 0.26+: none
        ("def g(self, t):\n        return self.processing_class(text=t)\n", False),
    ],
)
def test_probe_reads_the_code(code_module, body, verdict):
    from trl_compat.patches import prompt_right_truncation as prt

    module = code_module(f"class GRPOTrainer:\n    {body}")
    assert prt.probe(module).needed is verdict
