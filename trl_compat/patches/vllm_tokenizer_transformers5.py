"""vllm-tokenizer-transformers5: vLLM < 0.12 cannot load a tokenizer on transformers 5 (advice only).

The bug
    vLLM's ``vllm/transformers_utils/tokenizer.py:get_cached_tokenizer``, which every ``LLM(...)``
    and ``trl vllm-serve`` runs on the model's tokenizer, reads
    ``tokenizer.all_special_tokens_extended``. transformers 5 removed that property
    (transformers PR #40936), so the engine dies with ``AttributeError: ... has no attribute
    'all_special_tokens_extended'``. Reports show it in vLLM 0.7.3, 0.9.x and 0.11.0; where it
    started was not traced (the window starts at the first vLLM).
    Upstream: vLLM PR #29686 (fixed in vLLM 0.12.0). TRL replaces ``get_cached_tokenizer`` itself
    from 0.26.0 (commit ``ca21dd94c``, then ``trl/_compat.py``: ``_patch_vllm_cached_tokenizer``)
    up to 1.2.x: PR #5549 (``0a54b4d19``, TRL 1.3.0) removed the shim when TRL declared
    vLLM >= 0.12. So TRL 0.14.0 - 0.25.x (and the 0.26.0.dev0 builds before ``ca21dd94c``) and
    TRL >= 1.3.0 pinned with a vLLM older than they declare meet it.

How the probe decides
    The gate finds TRL, vLLM and transformers in their windows. Where TRL's own compatibility code
    (``trl/_compat.py``, ``trl/__init__.py``; read, not imported) replaces vLLM's
    ``get_cached_tokenizer`` (TRL 0.26.0 - 1.2.x): "not needed". transformers 5.0.0.dev0 builds from
    before PR #40936 still have the property: the probe reads it on
    ``PreTrainedTokenizerBase`` and says "not needed" there, "undecided" (with the upgrade) where
    it is gone. It does not import vLLM (see vllm-disabled-tqdm): the versions decide for vLLM.

Why no fix
    TRL's shim rebuilds vLLM's whole ``get_cached_tokenizer`` (40 lines of vLLM's code, which
    other vLLM modules bind by name), and no real vLLM runs on trl_compat's CPU test machines:
    it could not be proved. Upgrading vLLM to 0.12.0 (or staying on transformers 4.x) ends it.
    ``changes`` names what TRL's shim replaces.

Delete when: trl_compat no longer supports TRL < 0.26, nor TRL >= 1.3 with vLLM < 0.12 on
transformers 5 (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import not_needed
from trl_compat.patches._advice import advise, refusing_apply, trl_shims

ADVICE = "upgrade vllm to 0.12.0 or newer (or pin transformers<5)"


def probe(module):
    from transformers import PreTrainedTokenizerBase

    if trl_shims("vllm.transformers_utils.tokenizer.get_cached_tokenizer = get_cached_tokenizer"):
        return not_needed("TRL replaces vLLM's get_cached_tokenizer itself (TRL 0.26 - 1.2)")

    if hasattr(PreTrainedTokenizerBase, "all_special_tokens_extended"):
        return not_needed("transformers still has PreTrainedTokenizerBase.all_special_tokens_extended")
    return advise(
        "vLLM < 0.12's get_cached_tokenizer reads tokenizer.all_special_tokens_extended, which transformers 5 removed "
        "(AttributeError when vLLM loads the tokenizer)",
        ("vllm", "transformers"),
        ADVICE,
    )


apply = refusing_apply("vllm-tokenizer-transformers5")
