"""A tiny Qwen2-VL, its processor and an image dataset, built in code (nothing from the Hub, no Pillow).

    trainer = make_trainer(tmp_path, steps=1)           # grpo_run.make_trainer's conventions, on the VLM
    processor = make_processor(mm_token_type_ids=True)  # transformers' own Qwen2VLProcessor code
    model = make_model(takes_mm_token_type_ids=True)    # random-init Qwen2VLForConditionalGeneration

Why Qwen2-VL: ``Qwen2VLForConditionalGeneration`` and ``Qwen2VLProcessor`` exist in every transformers the
cells pin from 4.53 on (the configuration takes ``text_config`` / ``vision_config`` from 4.53), and its
processor gives the keys GRPO's VLM path meets: ``pixel_values``, ``image_grid_thw`` and, where asked
(``return_mm_token_type_ids``), ``mm_token_type_ids`` (1 at the image tokens). transformers 5.3 made that
the processor's default, and its model reads them for the multimodal RoPE (``get_rope_index``); in 5.1 -
5.2 the one processor that returns them unasked is ERNIE-4.5-VL's (Gemma 3's are ``token_type_ids``).
Checked: a GRPO step on transformers 4.53.3 (TRL 0.20.0), 4.57.6, 5.2.0, 5.3.0 and 5.16.1 (TRL 0.28 - 0.29).

The parts, small enough for a GRPO step in about a second on one CPU core:

* ``make_tokenizer()``  a WordLevel ``PreTrainedTokenizerFast`` (``VOCAB_SIZE`` entries): ``<pad>`` 0,
  ``</s>`` 1 (EOS), ``<unk>`` 2, then Qwen2-VL's chat and vision tokens (``SPECIAL_TOKENS``), the roles,
  and ``tiny.vocab_words()``. Left padding, as GRPO wants.
* ``ImageProcessor``  Qwen2-VL's image preprocessing (rescale, CLIP normalisation, the frame repeated
  ``TEMPORAL_PATCH_SIZE`` times, patches of ``PATCH_SIZE`` grouped by ``MERGE_SIZE``: the layout of
  ``Qwen2VLImageProcessor``) in numpy: transformers' own needs Pillow, which no cell installs. It takes
  images whose sides are multiples of ``PATCH_SIZE * MERGE_SIZE`` (no resizing), as arrays or nested lists
  (a ``datasets.Dataset`` row's); an ``IMAGE_SIZE`` image is 4 x 4 patches, 4 image tokens.
* ``make_processor(mm_token_type_ids=None)``  ``Qwen2VLProcessor`` over those two, with a Qwen2-VL-like
  chat template (``CHAT_TEMPLATE``): a subclass whose only parts are the image processor and the
  tokenizer (transformers 4.x requires a ``BaseVideoProcessor``, which needs torchvision) and which
  accepts them as such (without Pillow, the class transformers checks an image processor against is a
  placeholder; 4.x wants Qwen2's tokenizer classes by name). Everything it computes is
  ``Qwen2VLProcessor``'s. ``mm_token_type_ids``: None keeps transformers' default; True / False asks
  for them or not through the tokenizer's init kwargs, where a processor reads its text defaults.
  transformers < 4.56: its ``apply_chat_template(..., tokenize=True)`` loads images with Pillow (TRL of
  those days renders the text and calls the processor itself).
* ``make_model(seed=0, takes_mm_token_type_ids=False)``  a random-init Qwen2-VL: text hidden 64, 2 layers,
  4 heads / 2 KV heads (head dim 16, M-RoPE sections 2 / 3 / 3), a one-block vision tower of width 32;
  float32, deterministic, the global RNG left as it was. ``takes_mm_token_type_ids`` on transformers < 5.3:
  ``model_class``'s subclass that takes (and drops) them, so that ``generate`` accepts a processor's.
* ``make_image(i)``, ``dataset(n)``  tiny deterministic RGB images (uint8 arrays) and a
  ``datasets.Dataset`` of conversational prompts (``"prompt"``: one user turn of vocabulary words) with
  one image each (``"image"``); TRL puts the image into the user turn.
* ``make_trainer(tmp_path, ...)``  ``grpo_run.make_trainer`` with the model (saved to ``tmp_path``, as
  ``grpo_run`` does with a model instance), the processor and the dataset above (``make_*()`` unless
  given); every other keyword passes through. ``max_prompt_length=None`` unless given: GRPO must not cut
  the image tokens out of a prompt.
"""

from __future__ import annotations

import functools
import inspect
import os
from typing import Any

import numpy as np
import torch

import grpo_run
import tiny

PAD, EOS, UNK = tiny.PAD, tiny.EOS, tiny.UNK
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
SPECIAL_TOKENS = (PAD, EOS, UNK, IM_START, IM_END, VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
ROLES = ("system", "user", "assistant")
VOCAB_SIZE = tiny.VOCAB_SIZE

PATCH_SIZE, MERGE_SIZE, TEMPORAL_PATCH_SIZE = 4, 2, 2
IMAGE_SIZE = 16  # pixels a side: 4 x 4 patches, merged 2 x 2 into 4 image tokens
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)  # OpenAI CLIP's, as Qwen2VLImageProcessor
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)

# Qwen2-VL's template, shortened: a turn is "<|im_start|>role words<|im_end|>", an image is
# "<|vision_start|><|image_pad|><|vision_end|>" (the processor repeats <|image_pad|> once per image token).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + ' ' }}"
    "{%- if message['content'] is string %}{{ message['content'] }}"
    "{%- else %}{%- for content in message['content'] %}"
    "{%- if content['type'] == 'image' or 'image' in content %}{{ '<|vision_start|><|image_pad|><|vision_end|> ' }}"
    "{%- elif content['type'] == 'text' %}{{ content['text'] }}{%- endif %}"
    "{%- endfor %}{%- endif %}"
    "{{ '<|im_end|> ' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant ' }}{%- endif %}"
)


def vocab_words() -> list[str]:
    """The plain words of the vocabulary: the roles, then ``tiny.vocab_words()`` up to ``VOCAB_SIZE`` entries."""
    return list(ROLES) + tiny.vocab_words()[: VOCAB_SIZE - len(SPECIAL_TOKENS) - len(ROLES)]


def make_tokenizer(**init_kwargs: Any):
    """The WordLevel tokenizer of the module docstring; ``init_kwargs`` go to its constructor (and so into
    ``tokenizer.init_kwargs``, where a processor reads its text defaults)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(list(SPECIAL_TOKENS) + vocab_words())}
    assert len(vocab) == VOCAB_SIZE
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=UNK,
        additional_special_tokens=list(SPECIAL_TOKENS[3:]),
        padding_side="left",
        model_input_names=["input_ids", "attention_mask"],
        **init_kwargs,
    )
    tokenizer.padding_side = "left"
    tokenizer.model_input_names = ["input_ids", "attention_mask"]
    return tokenizer


def token_id(token: str) -> int:
    return SPECIAL_TOKENS.index(token)


def _image_processor_base() -> type:
    from transformers.image_processing_utils import BaseImageProcessor

    return BaseImageProcessor


def _is_image(value: Any) -> bool:
    if isinstance(value, (str, bytes, dict)) or value is None:
        return False
    try:
        array = np.asarray(value)
    except ValueError:  # ragged: a list of images of different sizes
        return False
    return array.ndim == 3 and array.dtype != object


def _flat_images(images: Any) -> list[np.ndarray]:
    if _is_image(images):
        return [np.asarray(images)]
    if isinstance(images, (list, tuple)):
        return [image for item in images if item is not None for image in _flat_images(item)]
    raise TypeError(f"not an image or a list of images: {type(images).__name__}")


class ImageProcessor(_image_processor_base()):  # type: ignore[misc]
    """Qwen2-VL's image preprocessing in numpy (module docstring); returns ``pixel_values`` (patches x
    ``3 * TEMPORAL_PATCH_SIZE * PATCH_SIZE**2``) and ``image_grid_thw`` (one ``(1, h, w)`` row an image)."""

    model_input_names = ["pixel_values", "image_grid_thw"]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.patch_size = PATCH_SIZE
        self.merge_size = MERGE_SIZE
        self.temporal_patch_size = TEMPORAL_PATCH_SIZE
        self.image_mean = list(IMAGE_MEAN)
        self.image_std = list(IMAGE_STD)

    def fetch_images(self, images: Any) -> Any:
        """Images as arrays, in the nesting given (transformers >= 5.x fetches what is not an array: a URL,
        a path, and a ``datasets`` row's nested lists, which it cannot read)."""
        if _is_image(images):
            return np.asarray(images, dtype=np.uint8)
        if isinstance(images, (list, tuple)):
            return [self.fetch_images(item) for item in images]
        return images

    def _patches(self, image: np.ndarray) -> tuple[np.ndarray, tuple[int, int, int]]:
        if image.shape[-1] != 3 and image.shape[0] == 3:  # channels first
            image = image.transpose(1, 2, 0)
        height, width, channels = image.shape
        factor = self.patch_size * self.merge_size
        if height % factor or width % factor:
            raise ValueError(f"image sides must be multiples of {factor} (no resizing here): {height} x {width}")
        pixels = (image.astype(np.float32) / 255.0 - np.array(self.image_mean, np.float32)) / np.array(self.image_std, np.float32)
        frames = np.repeat(pixels.transpose(2, 0, 1)[None], self.temporal_patch_size, axis=0)  # (T, C, H, W)
        grid_t, grid_h, grid_w = 1, height // self.patch_size, width // self.patch_size
        patches = frames.reshape(
            grid_t,
            self.temporal_patch_size,
            channels,
            grid_h // self.merge_size,
            self.merge_size,
            self.patch_size,
            grid_w // self.merge_size,
            self.merge_size,
            self.patch_size,
        ).transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
        flat = patches.reshape(grid_t * grid_h * grid_w, channels * self.temporal_patch_size * self.patch_size**2)
        return flat, (grid_t, grid_h, grid_w)

    def preprocess(self, images: Any, return_tensors: Any = None, **kwargs: Any):
        from transformers.image_processing_utils import BatchFeature

        flat, grids = [], []
        for image in _flat_images(images):
            patches, grid = self._patches(image)
            flat.append(patches)
            grids.append(grid)
        data = {"pixel_values": np.concatenate(flat, axis=0), "image_grid_thw": np.array(grids, dtype=np.int64)}
        return BatchFeature(data=data, tensor_type=return_tensors)


_PROCESSOR_CLASSES: dict[type, type] = {}


def processor_class() -> type:
    """``Qwen2VLProcessor`` with the image processor and the tokenizer as its only parts (no video processor)."""
    from transformers import PreTrainedTokenizerBase, Qwen2VLProcessor

    cls = _PROCESSOR_CLASSES.get(Qwen2VLProcessor)
    if cls is None:

        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            Qwen2VLProcessor.__init__(self, image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        def check_argument_for_proper_class(self, argument_name, argument):
            # without Pillow, transformers' ImageProcessingMixin (the class a processor checks its image
            # processor against) is a placeholder that nothing is an instance of; transformers 4.x wants
            # Qwen2's tokenizer classes by name
            if argument_name == "image_processor" and isinstance(argument, ImageProcessor):
                return ImageProcessor
            if argument_name == "tokenizer" and isinstance(argument, PreTrainedTokenizerBase):
                return PreTrainedTokenizerBase
            return Qwen2VLProcessor.check_argument_for_proper_class(self, argument_name, argument)

        cls = type(
            "TinyQwen2VLProcessor",
            (Qwen2VLProcessor,),
            {
                "__init__": __init__,
                "check_argument_for_proper_class": check_argument_for_proper_class,
                "__module__": __name__,
                "attributes": ["image_processor", "tokenizer"],  # transformers 4.x reads this list, 5.x __init__'s
                "video_processor": None,
            },
        )
        _PROCESSOR_CLASSES[Qwen2VLProcessor] = cls
    return cls


def make_processor(mm_token_type_ids: bool | None = None):
    """transformers' ``Qwen2VLProcessor`` (``processor_class()``) over ``ImageProcessor`` and ``make_tokenizer``.

    ``mm_token_type_ids``: None keeps transformers' default (returned from 5.3 on); True / False asks the
    processor to return them or not, through the tokenizer's init kwargs."""
    init_kwargs = {} if mm_token_type_ids is None else {"return_mm_token_type_ids": bool(mm_token_type_ids)}
    processor = processor_class()(
        image_processor=ImageProcessor(), tokenizer=make_tokenizer(**init_kwargs), chat_template=CHAT_TEMPLATE
    )
    return processor


def model_config(**text_overrides: Any):
    """The ``Qwen2VLConfig`` of ``make_model``; ``text_overrides`` replace fields of its text config."""
    import transformers
    from packaging.version import Version
    from transformers import Qwen2VLConfig

    text: dict[str, Any] = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        use_sliding_window=False,
        max_window_layers=2,
        pad_token_id=token_id(PAD),
        eos_token_id=token_id(EOS),
        bos_token_id=None,
    )
    mrope = {"mrope_section": [2, 3, 3]}  # sums to head_dim / 2 = 8
    if Version(transformers.__version__).major >= 5:
        text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, **mrope}
    else:
        text.update(rope_theta=10000.0, rope_scaling={"type": "mrope", **mrope})
    text.update(text_overrides)
    vision = dict(
        depth=1,
        embed_dim=32,
        hidden_size=text["hidden_size"],  # the merger's output: the text model's width
        mlp_ratio=2,
        num_heads=2,
        in_channels=3,
        patch_size=PATCH_SIZE,
        spatial_merge_size=MERGE_SIZE,
        temporal_patch_size=TEMPORAL_PATCH_SIZE,
    )
    return Qwen2VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=token_id(IMAGE_PAD),
        video_token_id=token_id(VIDEO_PAD),
        vision_start_token_id=token_id(VISION_START),
        vision_end_token_id=token_id(VISION_END),
        pad_token_id=token_id(PAD),
        eos_token_id=token_id(EOS),
        tie_word_embeddings=False,
    )


def reads_mm_token_type_ids() -> bool:
    """Whether the installed transformers' Qwen2-VL takes ``mm_token_type_ids`` (5.3 on: its M-RoPE reads them)."""
    from transformers import Qwen2VLForConditionalGeneration

    return "mm_token_type_ids" in inspect.signature(Qwen2VLForConditionalGeneration.forward).parameters


_MODEL_CLASSES: dict[type, type] = {}


def model_class(takes_mm_token_type_ids: bool = False) -> type:
    """``Qwen2VLForConditionalGeneration``; with ``takes_mm_token_type_ids`` on a transformers whose Qwen2-VL
    does not name them (< 5.3), a subclass under the same name whose ``forward`` takes ``mm_token_type_ids``
    and drops it. Its only use: the processor's ``mm_token_type_ids`` then pass ``generate``'s check of the
    model's arguments (``The following model_kwargs are not used by the model``), as they do where the model
    reads them (ERNIE-4.5-VL on 5.x, Qwen2-VL from 5.3), so a test can follow what TRL does with them.
    Saved, it is a plain Qwen2-VL checkpoint."""
    from transformers import Qwen2VLForConditionalGeneration

    if not takes_mm_token_type_ids or reads_mm_token_type_ids():
        return Qwen2VLForConditionalGeneration
    cls = _MODEL_CLASSES.get(Qwen2VLForConditionalGeneration)
    if cls is None:
        original = Qwen2VLForConditionalGeneration.forward

        @functools.wraps(original)
        def forward(self, *args, mm_token_type_ids=None, **kwargs):
            return original(self, *args, **kwargs)

        # generate() reads the forward's parameters (logits_to_keep, cache_position, ...): keep them, plus this one
        signature = inspect.signature(original)
        parameters = list(signature.parameters.values())
        extra = inspect.Parameter("mm_token_type_ids", inspect.Parameter.KEYWORD_ONLY, default=None)
        at = next((i for i, p in enumerate(parameters) if p.kind is inspect.Parameter.VAR_KEYWORD), len(parameters))
        forward.__signature__ = signature.replace(parameters=[*parameters[:at], extra, *parameters[at:]])

        cls = type(
            Qwen2VLForConditionalGeneration.__name__,
            (Qwen2VLForConditionalGeneration,),
            {"forward": forward, "__module__": Qwen2VLForConditionalGeneration.__module__},
        )
        _MODEL_CLASSES[Qwen2VLForConditionalGeneration] = cls
    return cls


def make_model(seed: int = 0, *, takes_mm_token_type_ids: bool = False, **text_overrides: Any):
    """A random-init Qwen2-VL (``model_class(takes_mm_token_type_ids)``, ``model_config(**text_overrides)``),
    float32, deterministic for a seed, the global RNG left as it was."""
    config = model_config(**text_overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(takes_mm_token_type_ids)(config)
    model.generation_config.pad_token_id = token_id(PAD)
    model.generation_config.eos_token_id = token_id(EOS)
    return model.to(torch.float32)


def make_image(i: int, size: int = IMAGE_SIZE) -> np.ndarray:
    """A deterministic ``size`` x ``size`` RGB image (uint8), different for each ``i``."""
    rows, cols = np.mgrid[0:size, 0:size]
    return np.stack([(rows * 16 + i * 37) % 256, (cols * 16 + i * 53) % 256, ((rows + cols) * 8 + i * 11) % 256], axis=-1).astype(
        np.uint8
    )


def dataset(n: int = 4, words_per_prompt: int = 3):
    """A ``datasets.Dataset``: ``"prompt"`` one user turn of vocabulary words, ``"image"`` one ``make_image(i)``."""
    from datasets import Dataset

    words = tiny.vocab_words()
    prompts = [
        [{"role": "user", "content": " ".join(words[(i * 37 + j * 11) % len(words)] for j in range(words_per_prompt))}]
        for i in range(n)
    ]
    return Dataset.from_dict({"prompt": prompts, "image": [make_image(i) for i in range(n)]})


def make_trainer(
    tmpdir: str | os.PathLike,
    *,
    model: Any = None,
    processor: Any = None,
    train_dataset: Any = None,
    **kwargs: Any,
):
    """``grpo_run.make_trainer`` on the tiny VLM (``make_model()``, ``make_processor()``, ``dataset()``
    unless given); ``max_prompt_length=None`` unless given; the other keywords pass through."""
    kwargs.setdefault("max_prompt_length", None)
    return grpo_run.make_trainer(
        tmpdir,
        model=model if model is not None else make_model(),
        processing_class=processor if processor is not None else make_processor(),
        train_dataset=train_dataset if train_dataset is not None else dataset(),
        **kwargs,
    )
