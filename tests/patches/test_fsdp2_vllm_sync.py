"""fsdp2-vllm-sync, with real FSDP2 (torch's ``fully_shard``) on the CPU and 2 processes.

Each 2-process test launches ``tests/support/fsdp2_worker.py`` under ``torch.distributed.run`` (TRL's
real GRPOTrainer on a tiny Qwen2, every parameter a sharded DTensor, 2 real GRPO training steps
on the shards, gloo) and
asserts on its ``F2|{json}`` markers: what TRL's real ``_move_model_to_vllm`` handed to vLLM
(colocate: ``load_weights``; server: ``update_named_param``), compared by value with the full
weights. One launch with the patch (strict mode), one with ``TRL_COMPAT_DISABLE``.
About 30-60 s per launch on 2 cores; only TRL 0.18.x/0.19.x (the window) run them, and with LoRA
TRL 0.20 - 0.25 (the second bug: TRL's own FSDP2 sync sends PEFT's names; the colocate endpoint
then loads into a stand-in vLLM model, which raises vLLM's ValueError for an unknown name).
"""

import trl_compat
from trl_compat.patches import fsdp2_vllm_sync

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

PATCH_ID = "fsdp2-vllm-sync"

TRL, TORCH, VLLM = installed("trl"), installed("torch"), installed("vllm")
TRL_AFFECTED = TRL is not None and Version("0.18.0") <= TRL < Version("0.20.0")
CAN_FSDP2 = TORCH is not None and TORCH >= Version("2.6.0")  # torch.distributed.fsdp.fully_shard

TRL_LORA_NAMES = TRL is not None and Version("0.20.0") <= TRL < Version("0.26.0")
# Without vLLM the patch is "not needed" (use_vllm cannot be on): the cells with the stand-in test it.
needs_fsdp2_window = pytest.mark.skipif(
    not (TRL_AFFECTED and CAN_FSDP2 and VLLM), reason="needs trl 0.18/0.19 (the window), vllm and torch >= 2.6"
)


needs_lora_names_window = pytest.mark.skipif(
    not (TRL_LORA_NAMES and CAN_FSDP2 and VLLM), reason="needs trl 0.20 - 0.25 (PEFT names in TRL's FSDP2 sync), vllm and torch >= 2.6"
)


@pytest.mark.skipif(not (TRL_AFFECTED and VLLM), reason="the FSDP1-only sync exists in trl 0.18/0.19 only; needs vllm")
def test_the_probe_reads_trls_fsdp1_only_sync():
    from trl_compat._helpers.source import code

    import trl.trainer.grpo_trainer as grpo

    source = code(grpo.GRPOTrainer._sync_fsdp_params_to_vllm)  # unwraps the patch's wrapper
    assert "isinstance(module, FSDP)" in source and "full_tensor" not in source
    assert fsdp2_vllm_sync.probe(grpo).needed is True
    assert grpo.GRPOTrainer._sync_fsdp_params_to_vllm.__trl_compat_patch__ == {PATCH_ID}


def test_names_are_the_base_models():
    name = fsdp2_vllm_sync.vllm_name
    assert name("model.layers.0.self_attn.q_proj.weight", None) == "model.layers.0.self_attn.q_proj.weight"
    assert name("model._checkpoint_wrapped_module.layers.0.mlp.up_proj.weight", None) == "model.layers.0.mlp.up_proj.weight"
    assert name("_orig_mod.lm_head.weight", None) == "lm_head.weight"
    peft = "base_model.model.model.layers.1.self_attn.v_proj."
    assert name(peft + "base_layer.weight", "lora_") == "model.layers.1.self_attn.v_proj.weight"
    assert name(peft + "base_layer.bias", "lora_") == "model.layers.1.self_attn.v_proj.bias"
    assert name(peft + "lora_A.default.weight", "lora_") is None
    assert name("base_model.model.lm_head.original_module.weight", "lora_") is None
    assert name("base_model.model.lm_head.modules_to_save.default.weight", "lora_") == "lm_head.weight"


def test_only_fsdp2_models_take_the_new_path():
    torch = pytest.importorskip("torch")
    assert not fsdp2_vllm_sync.fsdp2_sharded(torch.nn.Linear(2, 2))
    assert not fsdp2_vllm_sync.fsdp2_sharded(object())


# -- 2 processes, real FSDP2 --------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("fsdp2") / "tiny_qwen2", "qwen2")


def launch(model_dir, out_dir, disable="", peft=False):
    return launch_two("fsdp2_worker.py", model_dir, out_dir, *(["peft"] if peft else []), marker="F2|", disable=disable, timeout=480)


def check_fsdp2_training(run, peft=False):
    """What holds with or without the patch: really FSDP2-sharded, really trained."""
    assert run.returncode == 0, run.tail()
    for sharded in run.per_rank("sharded"):
        if peft:  # the base model inside the PeftModel is the FSDP2 root
            assert sharded["model"] == "PeftModel" and not sharded["is_fsdp2"], sharded
        else:
            assert sharded["is_fsdp2"] and sharded["model"].startswith("FSDP"), sharded
        assert sharded["fsdp2_modules"] >= 3, sharded  # the root and both decoder layers
        assert sharded["dtensor_params"] == sharded["params"] > 0, sharded  # every parameter sharded
        assert 0 < sharded["local_numel"] < sharded["full_numel"], sharded  # each rank holds a part
    for train in run.per_rank("train"):
        assert train["steps"] == 2 and len(train["losses"]) == 2 and train["finite"], train
        assert len(train["moved"]) > 0, train  # real optimizer steps: the full weights changed
    run.per_rank("done")
    return run.per_rank("sync", label="begin", mode="colocate")[0]["expected"]


@needs_fsdp2_window
def test_grpo_fsdp2_two_processes_with_patch(model_dir, tmp_path):
    run = launch(model_dir, tmp_path / "out")
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.APPLIED, versions
    names = check_fsdp2_training(run)
    assert "lm_head.weight" in names and "model.layers.1.mlp.down_proj.weight" in names
    for label in ("begin", "end"):
        for sync in run.per_rank("sync", label=label, mode="colocate"):  # one engine per rank
            assert sync["error"] is None, sync
            assert sorted(sync["names"]) == sync["expected"] == names, sync  # base names
            assert len(set(sync["names"])) == len(sync["names"]), sync  # each once
            assert sync["equal"] == names and sync["unequal"] == [], sync  # the full weights, by value
            assert sync["dtensors"] == [] and sync["resets"] == 1, sync
        server = run.per_rank("sync", label=label, mode="server")
        assert server[0]["is_main"], server[0]
        for sync in server:
            assert sync["error"] is None, sync
            if sync["is_main"]:  # TRL's rule: the main process sends (accelerate may call both ranks main)
                assert sorted(sync["names"]) == names and sync["equal"] == names, sync
                assert sync["unequal"] == [] and sync["resets"] == 1, sync
            else:  # the others only take part in the gathers
                assert sync["names"] == [] and sync["resets"] == 0, sync
    # the end sync's values are the trained weights, which moved: vLLM follows training
    assert run.per_rank("train")[0]["moved"]


@needs_fsdp2_window
def test_grpo_fsdp2_two_processes_without_patch(model_dir, tmp_path):
    run = launch(model_dir, tmp_path / "out", disable=PATCH_ID)
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.DISABLED, versions
    check_fsdp2_training(run)
    for label in ("begin", "end"):
        for mode in ("colocate", "server"):
            for sync in run.per_rank("sync", label=label, mode=mode):
                # TRL's FSDP1-only walk: nothing reaches vLLM, yet its cache is reset as if it had
                assert sync["error"] is None and sync["names"] == [], sync
        assert [s["resets"] for s in run.per_rank("sync", label=label, mode="colocate")] == [1, 1]


@needs_fsdp2_window
def test_grpo_fsdp2_peft_two_processes_with_patch(model_dir, tmp_path):
    pytest.importorskip("peft")
    run = launch(model_dir, tmp_path / "out", peft=True)
    names = check_fsdp2_training(run, peft=True)
    assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model.") for n in names), names
    assert "model.layers.0.self_attn.q_proj.weight" in names
    for label in ("begin", "end"):
        for sync in run.per_rank("sync", label=label, mode="colocate"):
            # TRL merged the adapter before the sync: vLLM gets W + scaling * B @ A under base names
            assert sync["error"] is None and sorted(sync["names"]) == names, sync
            assert sync["equal"] == names and sync["unequal"] == [], sync
    # only LoRA was trained: exactly the merged weights of the adapted projections moved
    for train in run.per_rank("train"):
        assert train["moved"] == sorted(f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qv")


# -- TRL 0.20 - 0.25: TRL's own FSDP2 sync, PEFT names ------------------------------------------


@pytest.mark.skipif(TRL is None or TRL < Version("0.20.0") or not VLLM, reason="TRL's own FSDP2 sync is 0.20+; needs vllm")
def test_the_probe_reads_trls_fsdp2_sync():
    import trl.trainer.grpo_trainer as grpo

    verdict = fsdp2_vllm_sync.probe(grpo)
    if TRL_LORA_NAMES:
        assert verdict.needed is True and "state_dict() names" in verdict.reason
        assert PATCH_ID in grpo.GRPOTrainer._sync_fsdp2_params_to_vllm.__trl_compat_patch__  # fsdp2-ignored-params-sync stacks on it
    else:  # 0.26.0 strips the PEFT prefixes itself (PR #4603); 0.28 moved the sync out of the trainer
        assert verdict.needed is False


def check_lora_syncs(run, names):
    for label in ("begin", "end"):
        for sync in run.per_rank("sync", label=label, mode="colocate"):
            assert sync["error"] is None and sorted(sync["names"]) == names, sync
            assert sync["equal"] == names and sync["unequal"] == [], sync  # merged weights, by value
            # the stand-in vLLM model holds them: every name it knows, loaded with the merged values
            assert sync["engine_equal"] == names, sync
        for sync in run.per_rank("sync", label=label, mode="server"):
            assert sync["error"] is None, sync
            if sync["is_main"]:
                assert sorted(sync["names"]) == names and sync["equal"] == names, sync


@needs_lora_names_window
def test_grpo_fsdp2_lora_names_two_processes_with_patch(model_dir, tmp_path):
    pytest.importorskip("peft")
    run = launch(model_dir, tmp_path / "out", peft=True)
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.APPLIED, versions
    names = check_fsdp2_training(run, peft=True)
    assert not any("lora_" in n or "base_layer" in n or n.startswith("base_model.") for n in names), names
    assert "model.layers.0.self_attn.q_proj.weight" in names
    check_lora_syncs(run, names)
    for train in run.per_rank("train"):  # only LoRA trained: the merged q/v projections moved
        assert train["moved"] == sorted(f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 1) for p in "qv")


@needs_lora_names_window
def test_grpo_fsdp2_lora_names_two_processes_without_patch(model_dir, tmp_path):
    pytest.importorskip("peft")
    run = launch(model_dir, tmp_path / "out", disable=PATCH_ID, peft=True)
    for versions in run.per_rank("versions"):
        assert versions["status"] == trl_compat.DISABLED, versions
    check_fsdp2_training(run, peft=True)
    for label in ("begin", "end"):
        for sync in run.per_rank("sync", label=label, mode="colocate"):
            assert sync["error"] is not None and sync["error"].startswith(
                "ValueError: There is no module or parameter named 'base_model'"
            ), sync
        for sync in run.per_rank("sync", label=label, mode="server"):
            if sync["is_main"]:  # the server gets PEFT's names (its worker raises the same ValueError)
                assert any(n.startswith("base_model.model.") for n in sync["names"]), sync
                assert any("lora_A" in n for n in sync["names"]), sync
