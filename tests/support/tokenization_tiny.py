"""The tokenizer class that ``tiny.save_tiny`` declares in a checkpoint's ``tokenizer_config.json``.

``save_tiny`` copies this file next to the saved ``tokenizer.json`` and names
``tokenization_tiny.TinyTokenizerFast`` under ``auto_map`` -> ``AutoTokenizer``, the custom-tokenizer
mechanism of transformers (what ``register_for_auto_class`` writes). It is "remote code" of the
checkpoint: transformers imports it from the checkpoint directory when ``trust_remote_code=True``,
so it imports nothing but transformers. The class adds nothing: it loads ``tokenizer.json`` as
written, which is the point (see ``tiny.save_tokenizer``).
"""

from transformers import PreTrainedTokenizerFast


class TinyTokenizerFast(PreTrainedTokenizerFast):
    """``PreTrainedTokenizerFast`` under its own name: the checkpoint's ``tokenizer.json``, unchanged."""
