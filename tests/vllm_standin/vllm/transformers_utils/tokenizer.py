"""Stand-in for ``vllm.transformers_utils.tokenizer``: TRL 0.26 - 0.29's ``import trl`` replaces
``get_cached_tokenizer`` here; the stand-in's ``LLM`` uses the plain tokenizer."""


def get_cached_tokenizer(tokenizer):
    return tokenizer
