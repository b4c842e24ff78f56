"""Offline builders for tiny test models, tokenizers and datasets.

Nothing here touches the Hugging Face Hub: the tokenizer is built from a word list with the
``tokenizers`` library, the models are random-init ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``
from an in-code config, and the dataset is made in memory.

* ``make_tokenizer()``  WordLevel tokenizer (512 entries incl. ``<pad>``/``</s>``/``<unk>``),
  WhitespaceSplit pre-tokenizer, wrapped in ``PreTrainedTokenizerFast`` with
  ``padding_side="left"`` and ``model_input_names=["input_ids", "attention_mask"]`` (without the
  latter, TRL 0.14's ``generate`` fails on ``token_type_ids``).
* ``make_model(arch)``  tiny random-init model, deterministic (seeded without touching the global
  RNG): vocab = tokenizer size, hidden 128, 2 layers, 4 heads / 2 KV heads (head_dim 32),
  intermediate 256, untied embeddings, float32.
* ``save_tiny(path, arch)``  model + tokenizer saved to a directory, for ``GRPOTrainer(model=<path>)``,
  DeepSpeed ZeRO-3 runs (which need a path) and the vLLM stand-in (which loads from a path). The
  tokenizer is saved by ``save_tokenizer``, so that ``AutoTokenizer.from_pretrained(path)`` gives it
  back as built on every transformers (see there).
* ``make_llama3_tokenizer()``  the same kind of tokenizer, Llama-3-style: it adds a BOS
  (``<|begin_of_text|>``) to every text it encodes with special tokens, and its chat template
  writes the BOS text itself, with ``<|start_header_id|>``/``<|end_header_id|>``/``<|eot_id|>``
  around each turn. Also 512 entries (usable with ``make_model``).
* ``prompt_dataset(n)``  ``datasets.Dataset`` with a plain-text ``"prompt"`` column.
* ``varying_reward``  deterministic reward that differs between completions, so GRPO advantages
  are non-zero. (The random model never emits EOS, so a length reward would be constant.)
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

ARCHS = ("qwen2", "llama")

PAD, EOS, UNK = "<pad>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)
VOCAB_SIZE = 512

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def vocab_words() -> list[str]:
    """The ``VOCAB_SIZE - 3`` plain words of the vocabulary (deterministic, lowercase CVCV words)."""
    syllables = [c + v for c in _CONSONANTS for v in _VOWELS]  # 70 syllables
    words: list[str] = []
    for first in syllables:
        for second in syllables:
            words.append(first + second)
            if len(words) == VOCAB_SIZE - len(SPECIAL_TOKENS):
                return words
    raise AssertionError("not enough words")  # pragma: no cover


def make_tokenizer():
    """A ``PreTrainedTokenizerFast`` over a WordLevel vocab of ``VOCAB_SIZE`` entries.

    Ids: ``<pad>`` = 0, ``</s>`` = 1, ``<unk>`` = 2, then the words of ``vocab_words()``.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + vocab_words())}
    assert len(vocab) == VOCAB_SIZE
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    # Belt and braces: some transformers versions only honour these as attributes.
    tokenizer.padding_side = "left"
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


BOS = "<|begin_of_text|>"
LLAMA3_SPECIAL_TOKENS = (PAD, EOS, UNK, BOS, "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>")
LLAMA3_ROLES = ("system", "user", "assistant")
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|> "
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|> {% endif %}"
)


def llama3_vocab_words() -> list[str]:
    """The plain words of ``make_llama3_tokenizer``'s vocabulary (the roles, then CVCV words)."""
    return list(LLAMA3_ROLES) + vocab_words()[: VOCAB_SIZE - len(LLAMA3_SPECIAL_TOKENS) - len(LLAMA3_ROLES)]


def make_llama3_tokenizer():
    """A Llama-3-style ``PreTrainedTokenizerFast`` (512 entries), built in code.

    Ids: ``<pad>`` 0, ``</s>`` 1 (EOS), ``<unk>`` 2, ``<|begin_of_text|>`` 3 (BOS),
    ``<|start_header_id|>`` 4, ``<|end_header_id|>`` 5, ``<|eot_id|>`` 6, then the roles and words of
    ``llama3_vocab_words()``. Encoding with special tokens (the default; what vLLM does) prepends
    the BOS, as Llama 3's post-processor does; the chat template starts with the BOS text, so
    ``tok(tok.apply_chat_template(msgs, tokenize=False))`` starts with two BOS ids.
    """
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from tokenizers.processors import TemplateProcessing
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(LLAMA3_SPECIAL_TOKENS) + llama3_vocab_words())}
    assert len(vocab) == VOCAB_SIZE
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = WhitespaceSplit()
    backend.post_processor = TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(LLAMA3_SPECIAL_TOKENS[4:]),
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.padding_side = "left"
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    tokenizer.chat_template = LLAMA3_CHAT_TEMPLATE
    return tokenizer


def model_config(arch: str = "qwen2", **overrides: Any):
    """The ``Qwen2Config`` / ``LlamaConfig`` used by ``make_model``; ``overrides`` replace fields."""
    from transformers import LlamaConfig, Qwen2Config

    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}, got {arch!r}")
    kwargs: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
        torch_dtype="float32",
    )
    if arch == "qwen2":
        kwargs.update(use_sliding_window=False, max_window_layers=2)
    kwargs.update(overrides)
    config_cls = Qwen2Config if arch == "qwen2" else LlamaConfig
    config = config_cls(**kwargs)
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size and arch == "qwen2":
        raise ValueError("Qwen2 needs hidden_size divisible by num_attention_heads")
    return config


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def make_model(arch: str = "qwen2", seed: int = 0, **overrides: Any):
    """Tiny random-init ``Qwen2ForCausalLM`` / ``LlamaForCausalLM`` (float32, eval-independent).

    Deterministic for a given ``(arch, seed, overrides)``; the global torch RNG state is left as it was.
    """
    from transformers import LlamaForCausalLM, Qwen2ForCausalLM

    config = model_config(arch, **overrides)
    model_cls = Qwen2ForCausalLM if arch == "qwen2" else LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model.to(torch.float32)


def save_tiny(path: str | os.PathLike, arch: str = "qwen2", model=None, tokenizer=None) -> str:
    """Save a tiny model (``make_model(arch)`` unless given) and tokenizer to ``path``; returns ``str(path)``."""
    path = os.fspath(path)
    os.makedirs(path, exist_ok=True)
    model = model if model is not None else make_model(arch)
    tokenizer = tokenizer if tokenizer is not None else make_tokenizer()
    model.save_pretrained(path, safe_serialization=True)
    save_tokenizer(path, tokenizer)
    return path


TOKENIZER_MODULE = "tokenization_tiny"  # tests/support/tokenization_tiny.py, copied into each checkpoint
TOKENIZER_AUTO_MAP = {"AutoTokenizer": [None, f"{TOKENIZER_MODULE}.TinyTokenizerFast"]}  # [slow, fast]


def save_tokenizer(path: str | os.PathLike, tokenizer) -> None:
    """Save ``tokenizer`` to ``path`` so that ``AutoTokenizer.from_pretrained(path)`` returns its own
    ``tokenizer.json``, whatever the model type in ``path``'s ``config.json``.

    Why: transformers 5 lists model types whose checkpoints' ``tokenizer_class`` it does not believe
    (``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`` in ``models/auto/tokenization_auto.py``; "qwen2"
    is in it from some 5.x between 5.5.4 and 5.14.1) and loads the model type's own class instead:
    ``Qwen2Tokenizer``, which rebuilds a byte-level BPE from the vocab and merges of
    ``tokenizer.json``. Our WordLevel vocab has no merges, so every word then encodes to no ids.

    What transformers does honour for those model types is a tokenizer the checkpoint declares as
    its own code: ``auto_map`` -> ``AutoTokenizer`` in ``tokenizer_config.json`` (the entry
    ``register_for_auto_class("AutoTokenizer")`` writes). With ``trust_remote_code=True`` it loads
    that class (``tokenization_tiny.TinyTokenizerFast``, a ``PreTrainedTokenizerFast`` under its own
    name, copied here); without, it skips the checkpoint's code for those model types and, as the
    ``auto_map`` keeps it from overriding the declared class, loads the saved ``tokenizer_class``
    (``TokenizersBackend`` on 5.x, ``PreTrainedTokenizerFast`` on 4.x) from ``tokenizer.json``.
    Either way: the ids of the tokenizer as built, on transformers 4.46 to 5.23 (test_fixtures.py).
    The ``tokenizer_class`` stays the one ``save_pretrained`` wrote (not the custom class's name, as
    ``register_for_auto_class`` would write it): transformers 4.x refuses an unknown class name
    when ``trust_remote_code`` is not set.
    """
    path = os.fspath(path)
    tokenizer.save_pretrained(path)
    shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{TOKENIZER_MODULE}.py"), path)
    config_file = os.path.join(path, "tokenizer_config.json")
    with open(config_file, encoding="utf-8") as f:
        config = json.load(f)
    config["auto_map"] = TOKENIZER_AUTO_MAP
    with open(config_file, "w", encoding="utf-8") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)


def prompt_dataset(n: int = 8, words_per_prompt: int = 5):
    """A ``datasets.Dataset`` with ``n`` short plain-text prompts made of vocabulary words."""
    from datasets import Dataset

    words = vocab_words()
    prompts = []
    for i in range(n):
        # deterministic, distinct prompts; stride coprime with len(words)
        prompts.append(" ".join(words[(i * 37 + j * 11) % len(words)] for j in range(words_per_prompt)))
    return Dataset.from_dict({"prompt": prompts})


def _completion_text(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: [{"role": "assistant", "content": ...}]
        return " ".join(m.get("content", "") for m in completion if isinstance(m, dict))
    return str(completion)


def varying_reward(prompts: Iterable[Any], completions: Iterable[Any], **kwargs: Any) -> list[float]:
    """Deterministic reward that varies between completions.

    Reward = number of ``a`` letters + 0.5 * number of ``o`` letters in the completion's words,
    + 0.01 * number of distinct words. Random completions differ in these counts, so rewards
    within a GRPO group differ and advantages are non-zero.
    """
    rewards = []
    for completion in completions:
        words = _completion_text(completion).split()
        text = "".join(words)
        rewards.append(float(text.count("a")) + 0.5 * text.count("o") + 0.01 * len(set(words)))
    return rewards


REWARD_PAD = UNK  # a pad token with id > 0: the embedding's padding_idx is then checked against its size


def make_reward_model(seed: int = 1, **overrides: Any):
    """Tiny random-init ``Qwen2ForSequenceClassification`` with one label (a reward model), float32.

    Its pad token is ``REWARD_PAD`` (id 2), so ``config.pad_token_id`` and the embedding's
    ``padding_idx`` are 2, as with real reward models whose pad token is not id 0."""
    from transformers import Qwen2ForSequenceClassification

    config = model_config("qwen2", num_labels=1, pad_token_id=SPECIAL_TOKENS.index(REWARD_PAD), **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
    return model.to(torch.float32).eval()


def save_tiny_reward(path: str | os.PathLike, seed: int = 1) -> str:
    """``make_reward_model(seed)`` and a tokenizer padding with ``REWARD_PAD`` saved to ``path``, for
    ``GRPOTrainer(reward_funcs=<path>)``, which loads it with ``AutoModelForSequenceClassification``."""
    tokenizer = make_tokenizer()
    tokenizer.pad_token = REWARD_PAD
    return save_tiny(path, model=make_reward_model(seed), tokenizer=tokenizer)


def save_tiny_with_generation_defaults(path: str | os.PathLike, arch: str = "qwen2", **generation: Any) -> str:
    """``make_model(arch)`` whose ``generation_config`` holds ``generation`` (e.g. ``temperature=0.05,
    top_p=0.5, top_k=3``, with ``do_sample=True`` so the config validates), saved with the tokenizer to
    ``path``, as a checkpoint's ``generation_config.json`` would be (``transformers_version``: the
    running one); returns ``str(path)``."""
    model = make_model(arch)
    for key, value in {"do_sample": True, **generation}.items():
        setattr(model.generation_config, key, value)
    return save_tiny(path, model=model)
