"""fsdp2-ignored-params-sync, with real FSDP2 (torch's ``fully_shard``, ``ignored_params``) on the CPU and 2 processes.

Each launch runs ``tests/support/fsdp2_ignored_worker.py`` under ``torch.distributed.run`` (gloo): a
tiny Qwen2 sharded per decoder layer and at the root, the root ignoring the final norm, then TRL's
real FSDP2 weight sync of the installed release (1.11+: ``VLLMGeneration._iter_fsdp2_params``;
0.28 - 1.10: ``VLLMGeneration._sync_fsdp2_params_to_vllm``; 0.20 - 0.27:
``GRPOTrainer._sync_fsdp2_params_to_vllm``) with recorders for what vLLM receives. One launch with
the patch (strict mode), one with ``TRL_COMPAT_DISABLE``. About 20-40 s per launch on 2 cores.
"""

import re

import trl_compat
from trl_compat.patches import fsdp2_ignored_params_sync

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed
from workers import launch_two

PATCH_ID = "fsdp2-ignored-params-sync"
TRL, TORCH, VLLM = installed("trl"), installed("torch"), installed("vllm")
IN_WINDOW = TRL is not None and TRL >= Version("0.20.0")
CAN_IGNORE = TORCH is not None and TORCH >= Version("2.7.0")  # fully_shard(ignored_params=...)
needs_window = pytest.mark.skipif(
    not (IN_WINDOW and VLLM and CAN_IGNORE), reason="needs trl >= 0.20 (TRL's FSDP2 sync), vllm and torch >= 2.7"
)
IGNORED = "model.norm.weight"
# one cell per shape of TRL's FSDP2 walk that runs on a CPU: GRPOTrainer's (0.20 - 0.27) and VLLMGeneration's
# generator (1.11+); each launch is 2 processes. VLLMGeneration's sync of 0.28 - 1.10 moves every CPU
# parameter to CUDA before full_tensor() (`param.to(torch.device("cuda"))`): its probe is checked in every
# cell, its values only on a GPU.
shapes = only_in_cells("trl0.26.0-tf4.57.3", "trl-newest", why="2-process FSDP2 launches")


@pytest.mark.skipif(TRL is None or VLLM is None, reason="needs trl and vllm")
def test_the_probe_reads_trls_fsdp2_walk():
    import trl.trainer.grpo_trainer as grpo

    verdict = fsdp2_ignored_params_sync.probe(grpo)
    assert verdict.needed is IN_WINDOW, verdict
    if IN_WINDOW:
        owner, name = fsdp2_ignored_params_sync.target(grpo)
        assert getattr(owner, name).__trl_compat_patch__ >= {PATCH_ID}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("fsdp2_ignored") / "tiny_qwen2", "qwen2")


def launch(model_dir, disable=""):
    run = launch_two("fsdp2_ignored_worker.py", model_dir, marker="FI|", disable=disable, timeout=300)
    assert run.returncode == 0, run.tail()
    run.per_rank("done")
    return run


@needs_window
@shapes
def test_sync_with_ignored_params_sends_every_weight(model_dir):
    run = launch(model_dir)
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.APPLIED, versions
    for sync in run.per_rank("sync"):
        assert sync["plain"] == [IGNORED], sync  # FSDP2 left the ignored parameter a plain tensor
        assert sync["error"] is None, sync
        # every weight, the ignored one included, equal to the model's full weights by value
        assert sorted(sync["names"]) == sync["expected"] and IGNORED in sync["names"], sync
        assert sync["equal"] == sync["expected"] and sync["unequal"] == [], sync
        assert sync["dtensors"] == [] and sync["methods_restored"], sync


@needs_window
@shapes
def test_unpatched_sync_raises_attribute_error(model_dir):
    run = launch(model_dir, disable=PATCH_ID)
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.DISABLED, versions
    for sync in run.per_rank("sync"):
        assert sync["plain"] == [IGNORED], sync
        # state_dict() values are Tensors (TRL < 1.11), named_parameters() ones Parameters (1.11+)
        assert re.fullmatch(r"AttributeError: '(Tensor|Parameter)' object has no attribute 'full_tensor'", sync["error"]), sync
        assert IGNORED not in sync["names"], sync
