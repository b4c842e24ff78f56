"""Tokenizers with the chat templates of two model families and a thinking variant, built in code (nothing from the Hub).

* ``make_llama31_tokenizer()``  Llama-3.1/3.2/3.3-like: its template, as Meta's, sets ``tools`` to
  ``none`` when it is not given and tests ``tools is not none``: an empty list renders the
  tool-calling boilerplate (``Environment: ipython`` in the system turn and the function-calling
  instruction in the user turn). ``BOILERPLATE`` lists those words.
* ``make_thinking_tokenizer()``  the Qwen3-like one whose generation prompt opens ``<think>``, which a
  past assistant turn does not show (as DeepSeek-R1 distills write it).
* ``make_qwen3_tokenizer()``  Qwen3-like: ``<|im_end|>`` is the EOS and the template writes
  ``<|im_end|>`` *and a newline* after every turn; tool results go into a user turn between
  ``<tool_response>`` tags. The newline is a token of its own, so the ids show whether it is there.

Both are WordLevel tokenizers of ``tiny.VOCAB_SIZE`` entries (usable with ``tiny.make_model``),
their special tokens first, then the template's words, then ``tiny.vocab_words()`` (prompts made of
those words tokenize without ``<unk>``).
"""

from __future__ import annotations

import tiny

PAD, UNK = tiny.PAD, tiny.UNK

# -- Llama 3.x -------------------------------------------------------------------------------------
BOS, HEADER_START, HEADER_END, EOT = "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
LLAMA31_SPECIAL = (PAD, EOT, UNK, BOS, HEADER_START, HEADER_END)
BOILERPLATE = ("Environment:", "ipython", "Given", "functions,", "respond", "JSON")
LLAMA31_CHAT_TEMPLATE = (
    "{%- if not tools is defined %}{%- set tools = none %}{%- endif %}"
    "{{ bos_token + '<|start_header_id|>system<|end_header_id|> ' }}"
    "{%- if tools is not none %}{{ 'Environment: ipython ' }}{%- endif %}"
    "{{ 'knowledge<|eot_id|>' }}"
    "{%- for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|> ' }}"
    "{%- if tools is not none and message['role'] == 'user' and loop.first %}"
    "{{ 'Given functions, respond JSON ' }}"
    "{%- for tool in tools %}{{ tool['function']['name'] + ' ' }}{%- endfor %}"
    "{%- endif %}"
    "{{ message['content'] + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|> ' }}{%- endif %}"
)

# -- Qwen3 -----------------------------------------------------------------------------------------
IM_START, IM_END, NEWLINE = "<|im_start|>", "<|im_end|>", "\n"
QWEN3_SPECIAL = (PAD, IM_END, UNK, IM_START)
QWEN3_WORDS = (NEWLINE, "<tool_response>", "</tool_response>", "<tool_call>", "</tool_call>")
QWEN3_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}{{ '<|im_start|>user' }}{%- endif %}"
    "{{ '\\n<tool_response>\\n' + message['content'] + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}{{ '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}"
    "{%- for call in message.get('tool_calls') or [] %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ call['function']['arguments'] | tojson }}{{ '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# -- a thinking template (DeepSeek-R1-distill style): the generation prompt opens <think>, a past ------
# assistant turn is written without it; the rest as Qwen3's
THINK = "<think>"
THINKING_CHAT_TEMPLATE = QWEN3_CHAT_TEMPLATE.replace(
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}",
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
)
assert THINKING_CHAT_TEMPLATE != QWEN3_CHAT_TEMPLATE


def _tokenizer(special, words, template, *, eos, bos=None):
    from tokenizers import Regex, Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Sequence, Split
    from transformers import PreTrainedTokenizerFast

    roles = ("system", "user", "assistant", "tool")
    plain = [w for w in tiny.vocab_words() if w not in roles]
    entries = list(special) + list(roles) + list(words)
    entries += plain[: tiny.VOCAB_SIZE - len(entries)]
    vocab = {tok: i for i, tok in enumerate(entries)}
    assert len(vocab) == tiny.VOCAB_SIZE
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    # a newline is a token of its own; spaces only separate
    backend.pre_tokenizer = Sequence([Split(Regex("\n"), behavior="isolated"), Split(Regex(" +"), behavior="removed")])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=eos,
        unk_token=UNK,
        **({"bos_token": bos} if bos else {}),
        additional_special_tokens=[t for t in special if t not in (PAD, UNK, eos, bos)],
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
    )
    tokenizer.padding_side = "left"
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    tokenizer.chat_template = template
    return tokenizer


def make_llama31_tokenizer():
    """Llama-3.x-like tokenizer: EOS ``<|eot_id|>`` (id 1), BOS written by the template."""
    return _tokenizer(LLAMA31_SPECIAL, BOILERPLATE + ("knowledge",), LLAMA31_CHAT_TEMPLATE, eos=EOT, bos=BOS)


def make_qwen3_tokenizer():
    """Qwen3-like tokenizer: EOS ``<|im_end|>`` (id 1), a newline token written after it."""
    return _tokenizer(QWEN3_SPECIAL, QWEN3_WORDS, QWEN3_CHAT_TEMPLATE, eos=IM_END)


def make_thinking_tokenizer():
    """The Qwen3-like tokenizer with :data:`THINKING_CHAT_TEMPLATE`: its generation prompt opens ``<think>``."""
    return _tokenizer(QWEN3_SPECIAL, (*QWEN3_WORDS, THINK), THINKING_CHAT_TEMPLATE, eos=IM_END)


def prompt_words(i: int, n: int = 4) -> str:
    """``n`` plain vocabulary words, different for each ``i``."""
    words = [w for w in tiny.vocab_words() if w not in ("system", "user", "assistant", "tool")]
    return " ".join(words[i * n + j] for j in range(n))
