"""vllm-prompt-truncation, vllm-prompt-special-tokens, vllm-double-bos: the prompt vLLM generates
from must be the prompt the loss is computed on, id for id.

* The stand-in's prompt handling (cells with the stand-in): a text is tokenised with special
  tokens (vLLM's way), token ids are taken as given, ``max_model_len`` is enforced with vLLM's error.
* Real GRPO runs with ``use_vllm`` (TRL 0.14/0.15 in-process engine, 0.18/0.19 ``vllm_mode="colocate"``)
  where each bug is in the way: prompts longer than ``max_prompt_length``; a Llama-3-style tokenizer
  (built in code) that adds a BOS and whose chat template writes the BOS text; 0.19.0's re-decoded
  prompts. Without the patch, the ids the stand-in received differ from the training prompt ids (or
  vLLM rejects the prompt); with it they are the same, exactly. Each bug is reproduced with the
  other two patches still applied: every patch corrects only its own part.
* The server client (TRL 0.16+, ``vllm_mode="server"``) only takes text: the text it is handed
  tokenises (with special tokens, as the server does) to the training ids.
* The probes, on source snippets of each TRL shape.
"""

from __future__ import annotations

import importlib
import importlib.util

import trl_compat
from trl_compat._engine import logs as engine_logs
from trl_compat._helpers import vllm_prompts

import pytest

TRUNCATION, SPECIAL, DOUBLE_BOS = "vllm-prompt-truncation", "vllm-prompt-special-tokens", "vllm-double-bos"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import grpo_run
    import tiny

requires_standin = pytest.mark.skipif(
    not HAVE_TORCH or not grpo_run.standin_vllm_installed(), reason="the vLLM stand-in is not installed"
)
requires_tokenizers = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch and transformers")

MAX_PROMPT = 16
BOS_ID, HEADER_START, HEADER_END, EOT = 3, 4, 5, 6


# -- the stand-in --------------------------------------------------------------------------------


@requires_standin
def test_standin_tokenises_text_like_vllm_and_takes_token_ids(tmp_path):
    from vllm import LLM, SamplingParams

    tok = tiny.make_llama3_tokenizer()
    path = tiny.save_tiny(tmp_path / "m", "llama", tokenizer=tok)
    llm = LLM(model=path, dtype="float32", gpu_memory_utilization=0.5, max_model_len=20)
    params = SamplingParams(temperature=0.0, max_tokens=2)
    text = tok.apply_chat_template([{"role": "user", "content": "baba bebe"}], tokenize=False, add_generation_prompt=True)
    plain = tok(text, add_special_tokens=False).input_ids
    assert plain[0] == BOS_ID and plain[1] == HEADER_START

    out = llm.generate([text, {"prompt_token_ids": plain}], params, use_tqdm=False)
    assert llm.received_prompt_ids == [[[BOS_ID] + plain, plain]]  # the text got a second BOS
    assert [o.prompt_token_ids for o in out] == [[BOS_ID] + plain, plain]
    assert [len(o.outputs[0].token_ids) for o in out] == [2, 2]

    too_long = " ".join(tiny.llama3_vocab_words()[10:30])  # 20 words + BOS = 21 > 20
    with pytest.raises(
        ValueError,
        match=r"^The decoder prompt \(length 21\) is longer than the maximum model "
        r"length of 20\. Make sure that `max_model_len` is no smaller",
    ):
        llm.generate(too_long, params, use_tqdm=False)
    assert llm.received_prompt_ids[-1] == [[BOS_ID] + tok(too_long, add_special_tokens=False).input_ids]


# -- real GRPO runs --------------------------------------------------------------------------------


def _grpo_or_skip(*patch_ids):
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patches' trigger)

    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    for pid in patch_ids:
        if trl_compat.status(pid) == trl_compat.NOT_NEEDED:
            pytest.skip(f"{pid} is not needed with this TRL: {trl_compat.report()}")
        # in window with the stand-in: a switched-off patch fails here, it does not skip
        assert trl_compat.status(pid) == trl_compat.APPLIED, trl_compat.report()


def _long_text_dataset():
    from datasets import Dataset

    words = tiny.vocab_words()
    # 20 words each: longer than max_prompt_length (16), within the colocate max_model_len (16 + 8)
    return Dataset.from_dict({"prompt": [" ".join(words[(i * 31 + j * 7) % 400] for j in range(20)) for i in range(4)]})


def _chat_dataset(words_per_prompt):
    from datasets import Dataset

    words = tiny.llama3_vocab_words()[3:]
    return Dataset.from_dict(
        {
            "prompt": [
                [{"role": "user", "content": " ".join(words[(i * 31 + j * 7) % 400] for j in range(words_per_prompt))}]
                for i in range(4)
            ]
        }
    )


def _train(tmp_path, tokenizer, dataset, **overrides):
    """A 2-step GRPO run with the stand-in; returns (prompt ids the stand-in ran, the training
    prompt ids), each as a set of tuples. Datasets have 4 prompts: 2 steps use each of them on
    every TRL (0.14: 4 prompts a step; later: 2 prompts x 2 completions)."""
    from trl.data_utils import maybe_apply_chat_template

    path = tiny.save_tiny(tmp_path / "model", "llama", tokenizer=tokenizer)  # vLLM loads this tokenizer
    trainer = grpo_run.make_trainer(
        tmp_path,
        model=path,
        use_vllm=True,
        steps=2,
        train_dataset=dataset,
        processing_class=tokenizer,
        max_prompt_length=MAX_PROMPT,
        max_completion_length=8,
        **overrides,
    )
    seen_by_loss = grpo_run.spy_training_prompt_ids(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    received = {tuple(ids) for call in trainer.llm.received_prompt_ids for ids in call}
    # TRL's training tokenisation of the prompts of this dataset
    expected = {
        tuple(tokenizer(maybe_apply_chat_template(x, tokenizer)["prompt"], add_special_tokens=False).input_ids[-MAX_PROMPT:])
        for x in dataset
    }
    if seen_by_loss is not None:  # TRL >= 0.15 returns them: check the test's reading of TRL
        assert seen_by_loss == expected
    return received, expected


def test_truncation_bug_without_the_patch(tmp_path, unpatched):
    _grpo_or_skip(TRUNCATION)
    tok = tiny.make_tokenizer()  # adds no special tokens: only the truncation differs
    with unpatched(TRUNCATION):
        received, expected = _train(tmp_path, tok, _long_text_dataset())
    assert {len(ids) for ids in expected} == {MAX_PROMPT}
    assert {len(ids) for ids in received} == {20}  # vLLM generated from the whole prompt
    assert {ids[-MAX_PROMPT:] for ids in received} == expected


def test_truncation_patched_vllm_runs_the_training_ids(tmp_path):
    _grpo_or_skip(TRUNCATION)
    received, expected = _train(tmp_path, tiny.make_tokenizer(), _long_text_dataset())
    assert received == expected and {len(ids) for ids in received} == {MAX_PROMPT}


def _crash_settings():
    if grpo_run.has_colocate_mode():
        return {}  # TRL 0.18/0.19 colocate: max_model_len = max_prompt_length + max_completion_length = 24
    if "vllm_max_model_len" in grpo_run.grpo_config_fields():
        return {"vllm_max_model_len": 24}  # TRL 0.15
    pytest.skip("TRL 0.14 sets no max_model_len")


def test_truncation_crash_without_the_patch(tmp_path, unpatched):
    _grpo_or_skip(TRUNCATION)
    from datasets import Dataset

    settings = _crash_settings()
    words = tiny.vocab_words()
    dataset = Dataset.from_dict({"prompt": [" ".join(words[i : i + 30]) for i in range(4)]})
    with (
        unpatched(TRUNCATION),
        pytest.raises(
            ValueError,
            match=r"The decoder prompt \(length 30\) is longer than "
            r"the maximum model length of 24\.",
        ),
    ):
        _train(tmp_path, tiny.make_tokenizer(), dataset, **settings)
    received, expected = _train(tmp_path / "patched", tiny.make_tokenizer(), dataset, **settings)
    assert received == expected


def test_double_bos_without_the_patch(tmp_path, unpatched):
    _grpo_or_skip(DOUBLE_BOS)
    tok = tiny.make_llama3_tokenizer()
    with unpatched(DOUBLE_BOS):
        received, expected = _train(tmp_path, tok, _chat_dataset(3))
    assert {ids[:2] for ids in expected} == {(BOS_ID, HEADER_START)}
    assert {ids[:3] for ids in received} == {(BOS_ID, BOS_ID, HEADER_START)}
    assert received == {(BOS_ID,) + ids for ids in expected}


def test_double_bos_patched_vllm_runs_the_training_ids(tmp_path):
    _grpo_or_skip(DOUBLE_BOS)
    received, expected = _train(tmp_path, tiny.make_llama3_tokenizer(), _chat_dataset(3))
    assert received == expected
    assert {ids[:2] for ids in received} == {(BOS_ID, HEADER_START)}


def test_double_bos_leaves_prompts_alone_that_tokenise_alike(tmp_path):
    """No special tokens added by the tokenizer: vLLM is handed TRL's own text, as without trl_compat."""
    _grpo_or_skip(DOUBLE_BOS)
    from datasets import Dataset

    dataset = Dataset.from_dict({"prompt": [" ".join(tiny.vocab_words()[i : i + 5]) for i in range(4)]})
    path = tiny.save_tiny(tmp_path / "model", "llama")
    trainer = grpo_run.make_trainer(tmp_path, model=path, use_vllm=True, steps=1, train_dataset=dataset, max_prompt_length=MAX_PROMPT)
    sent = []
    generate = trainer.llm.generate

    def spy(prompts, *args, **kwargs):
        sent.extend(prompts)
        return generate(prompts, *args, **kwargs)

    trainer.llm.generate = spy  # below trl_compat's instance wrapper
    trainer.train()
    assert sent and set(sent) <= set(dataset["prompt"])


def test_special_tokens_bug_without_the_patch(tmp_path, unpatched):
    _grpo_or_skip(SPECIAL)
    tok = tiny.make_llama3_tokenizer()
    with unpatched(SPECIAL):
        received, expected = _train(tmp_path, tok, _chat_dataset(3))
    specials = {BOS_ID, HEADER_START, HEADER_END, EOT}
    assert all(specials & set(ids) for ids in expected)
    # 0.19.0 decoded them away; vllm-double-bos (applied) keeps vLLM from adding a BOS of its own
    assert not any(specials & set(ids) for ids in received)
    assert received == {tuple(i for i in ids if i not in specials) for ids in expected}


def test_special_tokens_patched_vllm_runs_the_training_ids(tmp_path):
    _grpo_or_skip(SPECIAL)
    tok = tiny.make_llama3_tokenizer()
    # 3 words: 12 ids, whole; 10 words: 19 ids, truncated to 16 (the header and BOS cut off)
    received, expected = _train(tmp_path, tok, _chat_dataset(3))
    assert received == expected
    received, expected = _train(tmp_path / "long", tok, _chat_dataset(10))
    assert received == expected and {len(ids) for ids in expected} == {MAX_PROMPT}


# -- the server client (TRL 0.16+): text only ------------------------------------------------------


class _FakeClient:
    def __init__(self):
        self.prompts = []

    def generate(self, prompts, n=1, **kwargs):
        self.prompts.extend(prompts)
        return [[1]] * (len(prompts) * n)


@requires_tokenizers
@pytest.mark.parametrize(
    "fixes, words",
    [
        ((TRUNCATION, DOUBLE_BOS), 3),
        ((TRUNCATION, SPECIAL, DOUBLE_BOS), 3),
        ((TRUNCATION, DOUBLE_BOS), 10),
        ((TRUNCATION, SPECIAL, DOUBLE_BOS), 10),
    ],
)
def test_server_text_tokenises_to_the_training_ids(fixes, words, caplog):
    """Exact where a text can say it; a truncated prompt has lost its BOS, which no text can
    keep the server's tokenizer from adding back: one BOS too many, and a warning."""
    from types import SimpleNamespace

    tok = tiny.make_llama3_tokenizer()
    client = _FakeClient()
    trainer = SimpleNamespace(
        processing_class=tok,
        max_prompt_length=MAX_PROMPT,
        vllm_client=client,
        vllm_mode="server",
        accelerator=SimpleNamespace(num_processes=1),
    )
    words_list = tiny.llama3_vocab_words()[3 : 3 + words]
    inputs = [{"prompt": [{"role": "user", "content": " ".join(words_list)}]}]
    text = tok.apply_chat_template(inputs[0]["prompt"], tokenize=False, add_generation_prompt=True)
    training = tok(text, add_special_tokens=False).input_ids[-MAX_PROMPT:]
    # what TRL hands the server: the whole text (0.16 - 0.18), or 0.19.0's lossy decode
    sent_by_trl = tok.decode(training, skip_special_tokens=True) if SPECIAL in fixes else text

    def call(active):
        with _nested(trainer, active, inputs):
            trainer.vllm_client.generate(prompts=[sent_by_trl], n=2)
        assert "generate" not in vars(client)  # the instance wrapper is gone afterwards
        return tok(client.prompts[-1]).input_ids  # the server adds special tokens

    assert call(()) != training
    engine_logs._warned.clear()  # warn_once: once per process
    if len(training) < MAX_PROMPT:
        assert call(fixes) == training and "no text gives back" not in caplog.text
    else:
        assert training[0] != BOS_ID
        assert call(fixes) == [BOS_ID] + training and "no text gives back" in caplog.text


def _nested(trainer, fixes, inputs):
    import contextlib

    stack = contextlib.ExitStack()
    for fix in fixes:
        stack.enter_context(vllm_prompts._correcting(trainer, fix, inputs))
    return stack


# -- the probes ------------------------------------------------------------------------------------

_V014 = """
    def compute_loss(self, model, inputs):
        prompt_inputs = self.processing_class(prompts_text, padding_side="left", add_special_tokens=False)
        if self.max_prompt_length is not None:
            prompt_inputs["input_ids"] = prompt_inputs["input_ids"][:, -self.max_prompt_length :]
        all_prompts_text = gather_object(prompts_text)
        outputs = self.llm.generate(all_prompts_text, sampling_params=self.sampling_params, use_tqdm=False)
"""
_V017_SERVER = """
    def _generate_and_score_completions(self, inputs):
        prompt_inputs = self.processing_class(text=prompts_text, add_special_tokens=False)
        if self.max_prompt_length is not None:
            prompt_ids = prompt_ids[:, -self.max_prompt_length :]
        ordered_set_of_prompts = all_prompts_text[:: self.num_generations]
        completion_ids = self.vllm_client.generate(
            prompts=ordered_set_of_prompts, n=self.num_generations)
"""
_V0190 = """
    def _generate_and_score_completions(self, inputs):
        prompt_inputs = self.processing_class(text=prompts_text, add_special_tokens=False)
        if self.max_prompt_length is not None:
            prompt_ids = prompt_ids[:, -self.max_prompt_length :]
            prompts_text = self.processing_class.batch_decode(
                prompt_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False
            )
        all_outputs = self.llm.generate(all_prompts_text, sampling_params=sampling_params, use_tqdm=False)
"""
_V0191 = _V0190.replace("skip_special_tokens=True", "skip_special_tokens=False")
_TOKENS = """
    def _generate_and_score_completions(self, inputs):
        prompt_inputs = self.processing_class(text=prompts_text, add_special_tokens=False)
        all_outputs = self.llm.generate(prompts=[{"prompt_token_ids": p} for p in prompt_ids])
"""
_NO_VLLM = """
    def _generate_and_score_completions(self, inputs):
        return self.model.generate(inputs)
"""


@pytest.mark.parametrize(
    "body, truncation, special, double_bos",
    [
        (_V014, True, False, True),
        (_V017_SERVER, True, False, True),
        (_V0190, False, True, True),
        (_V0191, False, False, True),
        (_TOKENS, False, False, False),
        (_NO_VLLM, None, None, None),
    ],
)
def test_probes_read_the_generation_method(code_module, body, truncation, special, double_bos):
    from trl_compat.patches import vllm_double_bos, vllm_prompt_special_tokens, vllm_prompt_truncation

    module = code_module(f"class GRPOTrainer:\n{body}")
    verdicts = [m.probe(module).needed for m in (vllm_prompt_truncation, vllm_prompt_special_tokens, vllm_double_bos)]
    assert verdicts == [truncation, special, double_bos]


_V023_COLOCATE = """
    def _generate_and_score_completions(self, inputs):
        prompt_inputs = self.processing_class(text=prompts_text, padding_side="left", add_special_tokens=False)
        if self.max_prompt_length is not None:
            prompt_ids, prompt_mask = truncate_with_protected_tokens(prompt_ids, prompt_mask, self.max_prompt_length, protected)
            prompts_text = self.processing_class.batch_decode(prompt_ids, skip_special_tokens=False)
        if self.vllm_mode == "colocate":
            vllm_inputs = all_prompts_text
            with profiling_context(self, "vLLM.generate"):
                all_outputs = self.llm.generate(vllm_inputs, sampling_params=sampling_params, use_tqdm=False)
            completion_ids = [output.token_ids for outputs in all_outputs for output in outputs.outputs]
"""
_V024 = """
    def _generate_single_turn(self, prompts, images):
        if self.vllm_mode == "colocate":
            vllm_inputs = all_prompts_text
            all_outputs = self.llm.generate(vllm_inputs, sampling_params=sampling_params, use_tqdm=False)
            all_prompt_ids = [output.prompt_token_ids for output in all_outputs]
        else:
            generate_inputs = self.processing_class(text=prompts_text, truncation=True, add_special_tokens=False)
"""


@pytest.mark.parametrize("body, double_bos", [(_V023_COLOCATE, True), (_V024, False)])
def test_double_bos_probe_0_20_to_0_24(code_module, body, double_bos):
    """0.20 - 0.23.1 hand the colocated engine ``vllm_inputs = all_prompts_text``; 0.24 (#4152)
    trains on ``output.prompt_token_ids``."""
    from trl_compat.patches import vllm_double_bos

    module = code_module(f"class GRPOTrainer:\n{body}")
    assert vllm_double_bos.probe(module).needed is double_bos


@pytest.mark.skipif(not HAVE_TORCH or importlib.util.find_spec("trl") is None, reason="needs TRL")
def test_double_bos_probe_on_the_installed_trl():
    """The probe on the real TRL of the cell: needed 0.14 - 0.23.1 (where it finds the vLLM call),
    not needed from 0.24.0 (#4152)."""
    from trl_compat.patches import vllm_double_bos

    import trl.trainer.grpo_trainer as grpo
    from packaging.version import Version

    version = Version(importlib.import_module("trl").__version__)
    if not (Version("0.20.0") <= version <= Version("0.26.2")):
        pytest.skip("checked here for TRL 0.20 - 0.26 (older releases: the cells' status tests)")
    verdict = vllm_double_bos.probe(grpo)
    assert verdict.needed is (version < Version("0.24.0")), verdict
