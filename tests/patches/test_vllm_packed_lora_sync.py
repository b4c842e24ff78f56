"""vllm-packed-lora-sync: TRL >= 1.11's server-mode weight sync with LoRA, by value.

A real GRPO run (tiny Qwen2, LoRA on every projection, 2 training steps with the vLLM stand-in in
colocate mode, so that the adapter is trained: B != 0), then TRL's real ``VLLMGeneration.sync_weights``
in server mode: TRL's real ``VLLMClient.update_named_params`` on a recording HTTP session streams
``_iter_named_params()`` to the stand-in's packed producer, which, like vLLM's ``pack_tensors``, keeps
what it is given until the generator is exhausted and only then reads it. What the "server" received
is compared with the merged weights (W + B A scaling, read while the adapter is merged).
"""

import contextlib
import os

import trl_compat
from trl_compat.patches import vllm_packed_lora_sync

import pytest
from packaging.version import Version

pytest.importorskip("torch")  # grpo_run builds torch models: not in the notrl cell

from fake_http import packed_server_client as server_client
from grpo_run import LORA_TARGETS, make_trainer
from versions import installed

PATCH_ID = "vllm-packed-lora-sync"
TRL, VLLM, PEFT = installed("trl"), installed("vllm"), installed("peft")
IN_WINDOW = TRL is not None and TRL >= Version("1.11.0")
in_window = pytest.mark.skipif(
    not (IN_WINDOW and VLLM and PEFT), reason="TRL >= 1.11 (server mode's packed sync) with vllm (the stand-in) and peft"
)


@pytest.mark.skipif(TRL is None or VLLM is None, reason="needs trl and vllm")
def test_the_probe_reads_trls_walk():
    import trl.trainer.grpo_trainer as grpo

    verdict = vllm_packed_lora_sync.probe(grpo)
    assert verdict.needed is IN_WINDOW, verdict


def vllm_name(name):
    return name.removeprefix("base_model.model.").replace(".base_layer", "")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A trainer after 2 real GRPO steps with LoRA (colocate mode, the stand-in vLLM)."""
    # module-scoped: outside the per-test restore of conftest, so the environment colocate mode and the
    # stand-in write (VLLM_USE_V1, the rendezvous variables) is put back here for the tests after it
    saved = dict(os.environ)
    try:
        trainer = make_trainer(tmp_path_factory.mktemp("lora"), peft=True, use_vllm=True, steps=2)
        trainer.train()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return trainer


def server_sync(trainer, monkeypatch):
    """TRL's server-mode sync; returns (what the server received, the merged weights, the base weights)."""
    import torch

    generation = trainer.vllm_generation
    model = generation.model
    with torch.no_grad():
        model.merge_adapter()
        merged = {vllm_name(n): p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
        model.unmerge_adapter()
    base = {vllm_name(n): p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    client = server_client(monkeypatch)
    monkeypatch.setattr(generation, "mode", "server")
    monkeypatch.setattr(generation, "vllm_client", client, raising=False)
    monkeypatch.setattr(generation, "_weight_metadata", None, raising=False)
    generation.sync_weights()
    (sent,) = client.communicator.sent  # one packed broadcast: a tiny model is one 1 GiB bucket
    return dict(sent), merged, base


def adapted(names):
    """The weights LoRA adapts (2 layers x 7 projections; their biases are not adapted)."""
    return sorted(n for n in names if n.endswith(".weight") and any(f".{target}." in n for target in LORA_TARGETS))


@in_window
@pytest.mark.parametrize("drift_patch", ["on", "off"])
def test_server_receives_the_merged_weights(trained, monkeypatch, unpatched, drift_patch):
    """With vllm-lora-merge-drift (fresh tensors, this patch's walk not called) and without it (this patch's copies)."""
    import torch

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    with unpatched("vllm-lora-merge-drift") if drift_patch == "off" else contextlib.nullcontext():
        sent, merged, base = server_sync(trained, monkeypatch)
    assert sorted(sent) == sorted(merged)
    assert [n for n in sent if not torch.equal(sent[n], merged[n])] == []  # merged, by value
    # the run trained the adapter: the merged weights are not the base ones where LoRA acts
    lora = adapted(sent)
    assert len(lora) == 14 and all(not torch.equal(merged[n], base[n]) for n in lora)
    assert not trained.vllm_generation.model.base_model.model.model.layers[0].self_attn.q_proj.merged  # unmerged after


@in_window
def test_unpatched_server_receives_the_base_weights(trained, monkeypatch, unpatched):
    import torch

    # vllm-lora-merge-drift, above this patch, yields fresh merged tensors and never calls the walk
    # below it: both off, TRL's own walk
    with unpatched("vllm-lora-merge-drift"), unpatched(PATCH_ID):
        sent, merged, base = server_sync(trained, monkeypatch)
    differing = sorted(n for n in sent if not torch.equal(sent[n], merged[n]))
    # every LoRA-targeted weight was read after TRL's in-place unmerge: W + BA - BA, the base weights
    assert differing == adapted(sent) and len(differing) == 14
    for name in differing:
        assert torch.allclose(sent[name], base[name], atol=1e-6), name
        assert not torch.allclose(sent[name], merged[name], atol=1e-6), name
