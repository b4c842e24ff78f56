"""vlm-tool-messages (TRL 0.26.0 - 1.0.x): ``prepare_multimodal_messages``, which the GRPO trainer applies to
every prompt of a batch with images, rejects a prompt holding a tool call's turns (0.26.0 - 0.29.0) or leaves
the tool's result (and an empty assistant text) a bare string that the processor cannot tokenise (0.29.1 -
1.0.x). Fixed in 1.1.0 (PRs #5440, #5496).

By value, on the real TRL function (the name the trainer's module binds) and transformers' own
``ProcessorMixin.apply_chat_template``, called as the trainer tokenises its prompts (``_generate_single_turn``
in 0.26 - 0.29.0, ``_tokenize_prompts`` in 0.29.1 - 1.0: ``conversation=prompts, add_generation_prompt=True,
tokenize=True, return_dict=True, padding=True``). The processor is a tokenizer-only ``ProcessorMixin`` built
in code with an Idefics3/SmolVLM-style template (content read as a list of blocks): the cells have no image
library, and the crash is in the processor's shared code, before any image is read. The images are stand-in
objects: the function only places them.

* Unpatched: 0.26.0 - 0.29.0 raise ``ValueError: Invalid role in message: tool``; 0.29.1 - 1.0.x return the
  tool's result as the bare string, on which the processor raises ``TypeError: string indices must be
  integers``, and an empty assistant text as ``""``, on which the template raises ``UndefinedError``.
* Patched: the function gives TRL 1.1.0's answer (the same test runs unpatched in the fixed cells and gets
  it from TRL), and the prompt ids are those of the whole conversation, the tool's result included.
* The probe on code written as each release writes the function; the rebinding and its exact undo.
"""

from __future__ import annotations

import importlib.util
import types

import trl_compat
from trl_compat.patches import vlm_tool_messages as patch_module

import pytest

PATCH_ID = "vlm-tool-messages"
HAVE_TORCH = all(importlib.util.find_spec(m) is not None for m in ("torch", "transformers"))

if HAVE_TORCH:
    import grpo_run
    import tiny

IMAGE = types.SimpleNamespace(name="an image")  # stand-in: prepare_multimodal_messages only places it
CALL = [{"type": "function", "function": {"name": "kaba", "arguments": {}}}]
# a prompt with a past tool call: TRL's own parse_response writes the calling turn with content ""
TOOL_PROMPT = [
    {"role": "user", "content": "bada"},
    {"role": "assistant", "content": "", "tool_calls": CALL},
    {"role": "tool", "name": "kaba", "content": "bebi"},
    {"role": "user", "content": "bido"},
]
# what TRL 1.1.0 (and every release since) answers for TOOL_PROMPT with one image
TOOL_PROMPT_PREPARED = [
    {"role": "user", "content": [{"type": "image", "image": IMAGE}, {"type": "text", "text": "bada"}]},
    {"role": "assistant", "content": [{"type": "text", "text": ""}], "tool_calls": CALL},
    {"role": "tool", "name": "kaba", "content": [{"type": "text", "text": "bebi"}]},
    {"role": "user", "content": [{"type": "text", "text": "bido"}]},
]
# the same call's turn as a `datasets` column gives it back (no text: None), and one with no content key
NONE_PROMPT = [TOOL_PROMPT[0], {"role": "assistant", "content": None, "tool_calls": CALL}, TOOL_PROMPT[2]]
NO_CONTENT_PROMPT = [TOOL_PROMPT[0], {"role": "assistant", "tool_calls": CALL}, TOOL_PROMPT[2]]
EMPTY_REPLY_PROMPT = [{"role": "user", "content": "bada"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "bido"}]

# Idefics3 / SmolVLM's way of reading a message: its first block's type, then each block
TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }} "
    "{% if message['content'][0]['type'] == 'image' %}<image> {% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }} {% endif %}{% endfor %}"
    "{% for call in message.get('tool_calls') or [] %}{{ call['function']['name'] }} {% endfor %}</s> {% endfor %}"
    "{% if add_generation_prompt %}assistant {% endif %}"
)
TOOL_PROMPT_TEXT = "user <image> bada </s> assistant kaba </s> tool bebi </s> user bido </s> assistant "


def _trl_or_skip():
    if not HAVE_TORCH:
        pytest.skip("needs torch and transformers")
    pytest.importorskip("trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    return grpo_run.trl_version()[:3]


def _tool_calling_trl_or_skip():
    version = _trl_or_skip()
    if version < (0, 26, 0):
        pytest.skip("prepare_multimodal_messages(messages, images) and tool calling: TRL 0.26.0 on")
    return version


def _affected(version) -> bool:
    return (0, 26, 0) <= version < (1, 1, 0)


def _window_or_skip():
    version = _trl_or_skip()
    if not _affected(version):
        pytest.skip("TRL 0.26.0 - 1.0.x only")
    # in these cells the patch must be on: a switched-off patch fails here, it does not skip
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    return version


def _prepare(prompt, images):
    """The function as the GRPO trainer calls it: its module's binding."""
    from trl.trainer import grpo_trainer

    return grpo_trainer.prepare_multimodal_messages(prompt, images)


def _processor():
    """A tokenizer-only ProcessorMixin (the shared processor code every VLM processor runs)."""
    from transformers.processing_utils import ProcessorMixin

    class TextProcessor(ProcessorMixin):
        attributes = ["tokenizer"]
        tokenizer_class = "PreTrainedTokenizerFast"

        def __init__(self, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(tokenizer, chat_template=chat_template)

        def __call__(self, text=None, images=None, **kwargs):
            wanted = ("padding", "padding_side", "return_tensors", "add_special_tokens")
            return self.tokenizer(text, **{k: v for k, v in kwargs.items() if k in wanted})

    tokenizer = tiny.make_tokenizer()
    tokenizer.add_tokens(["user", "assistant", "tool", "<image>"])
    return TextProcessor(tokenizer, chat_template=TEMPLATE)


def _prompt_ids(processor, prompts):
    """The prompts tokenised as the trainer tokenises them (0.26 - 1.0)."""
    tokenized = processor.apply_chat_template(
        conversation=prompts, add_generation_prompt=True, tokenize=True, return_dict=True, padding=True
    )
    return [list(ids) for ids in tokenized["input_ids"]]


# -- the probe ---------------------------------------------------------------------------------------

_HEAD = "def prepare_multimodal_messages(messages, images):\n    for message in messages:\n"
_0_26 = (
    _HEAD + '        if message["role"] == "system":\n            pass\n'
    '        elif message["role"] == "assistant":\n'
    '            if isinstance(message["content"], str):\n'
    '                message["content"] = [{"type": "text", "text": message["content"]}]\n'
    '        else:\n            raise ValueError("Invalid role in message")\n    return messages\n'
)
_0_29_1 = (
    _HEAD + '        if message["role"] == "system":\n            pass\n'
    '        elif message["role"] == "assistant":\n'
    '            if message.get("content") and isinstance(message["content"], str):\n'
    '                message["content"] = [{"type": "text", "text": message["content"]}]\n'
    '        elif message["role"] == "tool":\n            # left as it is\n            continue\n'
    '        else:\n            raise ValueError("Invalid role in message")\n    return messages\n'
)
_OLD_TEST = 'message.get("content") and isinstance(message["content"], str)'
_NEW_TEST = 'isinstance(message.get("content"), str)'
_1_1 = _0_29_1.replace(_OLD_TEST, _NEW_TEST).replace(
    "            # left as it is\n            continue\n",
    '            if isinstance(message.get("content"), str):\n                message = {**message, "content": []}\n',
)
_1_2 = (
    _HEAD + '        if message["role"] in {"assistant", "system", "tool"}:\n'
    '            if isinstance(message.get("content"), str):\n                message = {**message, "content": []}\n'
    '        else:\n            raise ValueError("Invalid role in message")\n    return messages\n'
)
_BEFORE_5496 = _1_1.replace(_NEW_TEST, _OLD_TEST)
_UNKNOWN = _HEAD + '        message["content"] = list(message["content"])\n    return messages\n'
_0_24 = "def prepare_multimodal_messages(messages, num_images):\n    return None\n"


@pytest.mark.parametrize(
    "source, verdict",
    [
        (_0_26, True),
        (_0_29_1, True),
        (_BEFORE_5496, True),
        (_1_1, False),
        (_1_2, False),
        ("", False),
        (_UNKNOWN, None),
        (_0_24, False),  # TRL 0.20 - 0.25: no tool calling
    ],
    ids=["0.26-0.29.0", "0.29.1-1.0", "main-before-5496", "1.1.0", "1.2.0", "no-function", "unknown", "num_images"],
)
def test_probe_on_written_code(code_module, source, verdict):
    assert patch_module.probe(code_module(source)).needed is verdict


def test_probe_on_the_installed_trl():
    version = _trl_or_skip()
    from trl.trainer import grpo_trainer

    assert patch_module.probe(grpo_trainer).needed is _affected(version), patch_module.probe(grpo_trainer)


# -- the wrapper on a stand-in, stack-free ------------------------------------------------------------


def test_the_wrapper_passes_the_arguments_on_by_name_and_puts_the_kept_out_messages_back():
    seen = []

    def prepare(messages, images, *, flag="default"):
        seen.append((messages, images, flag))
        return [{**m, "seen": True} for m in messages]

    wrapped = patch_module._wrap(prepare, active=lambda: True)
    out = wrapped(images=["img"], messages=TOOL_PROMPT, flag="given")
    ((messages, images, flag),) = seen
    assert (images, flag) == (["img"], "given")
    # TRL's function gets the user turns and the calling turn, whose "" is one empty text block
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [{"type": "text", "text": ""}]
    # the tool message comes back at its place, wrapped, not passed through TRL's function
    assert [m.get("seen") for m in out] == [True, True, None, True]
    assert out[2] == {"role": "tool", "name": "kaba", "content": [{"type": "text", "text": "bebi"}]}
    assert TOOL_PROMPT[2]["content"] == "bebi" and TOOL_PROMPT[1]["content"] == ""  # the caller's prompt untouched

    seen.clear()
    plain = [{"role": "user", "content": "bada"}, {"role": "assistant", "content": "bebi"}]
    assert wrapped(plain, []) == [{**m, "seen": True} for m in plain] and seen[0][0] is plain  # nothing to help: TRL's call
    seen.clear()
    assert patch_module._wrap(prepare, active=lambda: False)(TOOL_PROMPT, []) and seen[0][0] is TOOL_PROMPT  # reverted


# -- TRL's function and the trainer's tokenisation, by value -----------------------------------------


def test_bug_reproduced_without_the_patch(unpatched):
    version = _window_or_skip()
    processor = _processor()
    with unpatched(PATCH_ID):
        if version < (0, 29, 1):
            with pytest.raises(ValueError, match=r"Invalid role in message: tool\. Expected 'user', 'assistant', or 'system'\."):
                _prepare(TOOL_PROMPT, [IMAGE])
            # the calling turn alone (before its tool message) fails too where it has no text
            with pytest.raises(TypeError, match="'NoneType' object is not iterable"):
                _prepare(NONE_PROMPT[:2], [IMAGE])
            with pytest.raises(KeyError, match="content"):
                _prepare(NO_CONTENT_PROMPT[:2], [IMAGE])
        else:
            prepared = _prepare(TOOL_PROMPT, [IMAGE])
            assert prepared[1]["content"] == "" and prepared[2]["content"] == "bebi"  # bare strings
            with pytest.raises(TypeError, match="string indices must be integers"):
                _prompt_ids(processor, [prepared])
            from jinja2.exceptions import UndefinedError

            empty_reply = _prepare(EMPTY_REPLY_PROMPT, [IMAGE])
            assert empty_reply[1]["content"] == ""
            with pytest.raises(UndefinedError, match="no element 0"):
                _prompt_ids(processor, [empty_reply])


def test_the_function_gives_trl_1_1s_answer():
    """In the window the patched function, in the fixed cells TRL's own: the same values."""
    _tool_calling_trl_or_skip()
    assert _prepare(TOOL_PROMPT, [IMAGE]) == TOOL_PROMPT_PREPARED
    assert _prepare(NONE_PROMPT, [IMAGE]) == [TOOL_PROMPT_PREPARED[0], NONE_PROMPT[1], TOOL_PROMPT_PREPARED[2]]
    assert _prepare(NO_CONTENT_PROMPT, [IMAGE]) == [TOOL_PROMPT_PREPARED[0], NO_CONTENT_PROMPT[1], TOOL_PROMPT_PREPARED[2]]
    assert _prepare(EMPTY_REPLY_PROMPT, [IMAGE])[1] == {"role": "assistant", "content": [{"type": "text", "text": ""}]}
    with pytest.raises(ValueError, match=r"Number of images provided \(2\) does not match number of image placeholders \(3\)"):
        _prepare([*TOOL_PROMPT[:3], {"role": "assistant", "content": [{"type": "image"}]}], [IMAGE, IMAGE])  # TRL's count
    assert TOOL_PROMPT[1]["content"] == "" and TOOL_PROMPT[2]["content"] == "bebi"  # the caller's prompt untouched


def test_the_trainer_tokenises_the_whole_conversation():
    _tool_calling_trl_or_skip()
    processor = _processor()
    prompts = [_prepare(TOOL_PROMPT, [IMAGE]), _prepare(EMPTY_REPLY_PROMPT, [IMAGE])]
    ids = _prompt_ids(processor, prompts)
    tokenizer = processor.tokenizer
    assert ids[0] == tokenizer(TOOL_PROMPT_TEXT)["input_ids"]
    assert tokenizer.convert_tokens_to_ids("bebi") in ids[0]  # the tool's result reaches the model
    assert ids[1][-len(tokenizer("user bido </s> assistant ")["input_ids"]) :] == tokenizer("user bido </s> assistant ")["input_ids"]


# -- the bindings and the exact undo -----------------------------------------------------------------


def test_every_loaded_binding_is_rebound_and_put_back(unpatched):
    version = _window_or_skip()
    import sys

    from trl_compat._engine.patcher import markers

    import trl.data_utils as data_utils
    from trl.trainer import grpo_trainer

    wrapper = grpo_trainer.prepare_multimodal_messages
    assert PATCH_ID in markers(wrapper) and data_utils.prepare_multimodal_messages is wrapper
    from trl.data_utils import prepare_multimodal_messages as imported_later  # as a module imported after apply

    assert imported_later is wrapper
    bound = {
        name: vars(sys.modules[name])["prepare_multimodal_messages"]
        for name in ("trl", "trl.trainer.rloo_trainer", "trl.trainer.sft_trainer", "trl.trainer.dpo_trainer")
        if name in sys.modules and "prepare_multimodal_messages" in vars(sys.modules[name])
    }
    assert all(function is wrapper for function in bound.values()), bound
    with unpatched(PATCH_ID):
        original = grpo_trainer.prepare_multimodal_messages
        assert original is data_utils.prepare_multimodal_messages and PATCH_ID not in markers(original)
        assert all(vars(sys.modules[name])["prepare_multimodal_messages"] is original for name in bound)
        # the wrapper a later module took answers as TRL does
        if version < (0, 29, 1):
            with pytest.raises(ValueError, match="Invalid role in message: tool"):
                imported_later(TOOL_PROMPT, [IMAGE])
        else:
            assert imported_later(TOOL_PROMPT, [IMAGE])[2]["content"] == "bebi"
    again = grpo_trainer.prepare_multimodal_messages
    assert PATCH_ID in markers(again) and data_utils.prepare_multimodal_messages is again
    assert all(vars(sys.modules[name])["prepare_multimodal_messages"] is again for name in bound)
