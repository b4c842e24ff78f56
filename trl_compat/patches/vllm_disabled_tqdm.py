"""vllm-disabled-tqdm: vLLM < 0.11.1 cannot download a model with huggingface_hub 1.1 - 1.9 (advice only).

The bug
    vLLM's ``vllm/model_executor/model_loader/weight_utils.py`` passes its own progress bar to
    ``huggingface_hub.snapshot_download(..., tqdm_class=DisabledTqdm)`` when it downloads the
    weights of a Hub model id::

        class DisabledTqdm(tqdm):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs, disable=True)

    huggingface_hub 1.1.0 made ``snapshot_download`` build its bytes bar as
    ``tqdm_class(desc=..., disable=is_tqdm_disabled(...), ...)`` (read in the 1.0.0, 1.0.1 and
    1.1.0 wheels: 1.0.x does not pass ``disable``), so ``LLM(model=...)`` (colocate) or
    ``trl vllm-serve`` dies with ``TypeError: ... got multiple values for keyword argument
    'disable'``. huggingface_hub 1.10.0 builds its bars through ``_create_progress_bar``, which
    passes ``disable`` only to its own tqdm subclasses, never to a foreign class such as vLLM's
    (read in the 1.9.0, 1.9.2, 1.10.0 and 2.4.0 code; huggingface_hub issue #4050): the window is
    huggingface_hub 1.1.0 - 1.9.x. huggingface_hub >= 1.0 needs transformers 5 (4.x pins
    ``huggingface_hub<1.0``), so the stack is a TRL < 0.26 on transformers 5 with an older vLLM.
    A local model path does not download and does not crash.
    Upstream: vLLM PR #28471 (fixed in vLLM 0.11.1). TRL shims it itself from 0.26.0 (commit
    ``ca21dd94c`` in ``trl/__init__.py``, then ``trl/_compat.py``: ``_patch_vllm_disabled_tqdm``)
    up to 1.2.x: PR #5549 (``0a54b4d19``, TRL 1.3.0) removed the shim when TRL declared
    vLLM >= 0.12. So TRL 0.14.0 - 0.25.x (and the 0.26.0.dev0 builds before ``ca21dd94c``) and
    TRL >= 1.3.0 pinned with a vLLM older than they declare meet it.

How the probe decides
    The gate finds TRL, vLLM and huggingface_hub in their windows. The probe reads TRL's own
    compatibility code (``trl/_compat.py``, ``trl/__init__.py``; read, not imported): where it
    replaces ``weight_utils.DisabledTqdm`` (TRL 0.26.0 - 1.2.x), "not needed"; elsewhere
    "undecided", naming the installed versions and the upgrade. It does not import vLLM to read
    ``DisabledTqdm`` (seconds at ``import trl``, and on this stack vLLM's import can fail on its
    own): the versions decide.

Why no fix
    TRL's shim (replace ``weight_utils.DisabledTqdm`` by a class that sets ``kwargs["disable"]``)
    is small, but the bug lives in vLLM's code, and no real vLLM runs on trl_compat's CPU test
    machines (the stand-in is not vLLM): the fix could not be proved. Upgrading vLLM to 0.11.1
    (or huggingface_hub to 1.10.0, or keeping it < 1.1) ends it. ``changes`` names what TRL's shim replaces.

Delete when: trl_compat no longer supports TRL < 0.26, nor TRL >= 1.3 with vLLM < 0.11.1 (the
registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

from trl_compat._engine import not_needed
from trl_compat.patches._advice import advise, refusing_apply, trl_shims

ADVICE = "upgrade vllm to 0.11.1 or newer (or huggingface_hub to 1.10.0 or newer)"


def probe(module):
    if trl_shims("weight_utils.DisabledTqdm = DisabledTqdm"):
        return not_needed("TRL replaces vLLM's DisabledTqdm itself (TRL 0.26 - 1.2)")
    return advise(
        "vLLM < 0.11.1's DisabledTqdm crashes when it downloads a model with huggingface_hub 1.1 - 1.9 "
        "(TypeError: got multiple values for keyword argument 'disable')",
        ("vllm", "huggingface_hub"),
        ADVICE,
    )


apply = refusing_apply("vllm-disabled-tqdm")
