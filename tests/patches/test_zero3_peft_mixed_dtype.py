"""zero3-peft-mixed-dtype: ZeRO-3 + LoRA on a bf16 model with DeepSpeed 0.19.2.

In-process: the probe on the installed TRL and on code written here; the wrapper's decisions
(ZeRO-3 on or off, a quantised model, a caller's own ``autocast_adapter_dtype``) with peft's real
``get_peft_model``. 2 processes (tests/support/zero3_lora_worker.py under ``torch.distributed.run``,
gloo, DeepSpeed's CPU accelerator): a real ZeRO-3 GRPO run with LoRA on a tiny Qwen2 in bf16;
without the patch DeepSpeed's first all-gather of the whole model fails (gloo's RuntimeError for
the TypeError NCCL raises), with it the LoRA weights train. About 40-60 s per launch on 2 cores.
"""

import importlib.util

import pytest
from packaging.version import Version

import written_code
from versions import installed
from workers import launch_two

PATCH_ID = "zero3-peft-mixed-dtype"
TYPE_ERROR = "TypeError: output tensor must have the same type as input tensor"  # NCCL's words
# gloo's words for the same mismatch (a bf16 parameter gathered into the fp32 buffer of the bucket's first one)
GLOO_ERROR = "RuntimeError: ProcessGroupGloo::allgather: invalid tensor type at index 0"
TRL, DS, PEFT = installed("trl"), installed("deepspeed"), installed("peft")
AFFECTED = (
    TRL is not None
    and DS is not None
    and PEFT is not None
    and importlib.util.find_spec("deepspeed") is not None
    and Version("0.19.2") <= DS < Version("0.19.3")
    and PEFT >= Version("0.12.0")
)
needs_affected = pytest.mark.skipif(
    not AFFECTED, reason=f"only DeepSpeed 0.19.2 with peft >= 0.12 (here trl {TRL}, deepspeed {DS}, peft {PEFT})"
)
# TRL >= 1.7 passes autocast_adapter_dtype=False itself for the peft_config it wraps: only a PeftModel passed in fails
needs_peft_config_bug = pytest.mark.skipif(
    TRL is None or TRL >= Version("1.7.0"), reason=f"TRL {TRL} >= 1.7 fixed the peft_config path"
)
needs_peft_trl = pytest.mark.skipif(TRL is None or PEFT is None, reason="needs trl and peft")


# -- probe -------------------------------------------------------------------------------------


@needs_peft_trl
def test_probe_on_installed_trl():
    from trl_compat.patches import zero3_peft_mixed_dtype as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    owner, where = patch.call_site(gt)
    if TRL < Version("1.7.0.dev0"):
        assert verdict.needed is True and "without autocast_adapter_dtype" in verdict.reason, verdict
        via_prepare = Version("0.22.0") <= TRL < Version("0.26.0")
        assert where == ("trl.models.utils.prepare_peft_model" if via_prepare else "GRPOTrainer.__init__"), where
        assert not patch.call_site_sets_kwarg(gt, owner, where)
    else:  # the peft_config path fixed (TRL #6091), a PeftModel passed in not
        assert verdict.needed is True and "a model passed as a PeftModel" in verdict.reason, verdict
        assert patch.call_site_sets_kwarg(gt, owner, where)


def _module(tmp_path, init_body):
    import textwrap

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        "def get_peft_model(model, config, **kwargs):\n    return model\n\n"
        "class GRPOTrainer:\n    def __init__(self, model, peft_config, args):\n" + textwrap.indent(init_body, " " * 8) + "\n"
    )
    module = written_code.load(path)
    return module


@needs_peft_trl
@pytest.mark.parametrize(
    "body, expected",
    [
        ("model = get_peft_model(model, peft_config)", True),  # TRL 0.14 - 1.6
        # TRL 1.7.0
        (
            "kwargs = {}\nif args.deepspeed_plugin is not None and args.deepspeed_plugin.zero_stage == 3:\n"
            "    kwargs['autocast_adapter_dtype'] = False\nmodel = get_peft_model(model, peft_config, **kwargs)",
            True,  # a PeftModel passed in is still cast by nobody
        ),
        ("self.model = model", None),
    ],
)
def test_probe_on_written_code(tmp_path, body, expected):
    from trl_compat.patches import zero3_peft_mixed_dtype as patch

    assert patch.probe(_module(tmp_path, body)).needed is expected


# -- the wrapper, with peft's real get_peft_model ----------------------------------------------------


@needs_affected
@pytest.mark.parametrize("zero3", [True, False])
def test_wrapper_passes_autocast_only_under_zero3(monkeypatch, tmp_path, zero3):
    from trl_compat.patches import zero3_peft_mixed_dtype as patch

    import torch
    import trl.trainer.grpo_trainer as gt
    from peft import LoraConfig

    import tiny

    owner, _ = patch.call_site(gt)
    monkeypatch.setattr(patch, "_zero3_enabled", lambda: zero3)
    config = LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")

    def lora_dtypes(**kwargs):
        model = tiny.make_model("qwen2").to(torch.bfloat16)
        wrapped = owner.get_peft_model(model, config, **kwargs)
        return {p.dtype for n, p in wrapped.named_parameters() if "lora_" in n}

    assert lora_dtypes() == ({torch.bfloat16} if zero3 else {torch.float32})
    assert lora_dtypes(autocast_adapter_dtype=True) == {torch.float32}  # the caller's choice stands


# -- 2 processes, real ZeRO-3 in bf16 ------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch

    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("zero3_lora") / "tiny_qwen2_bf16", model=tiny.make_model("qwen2").to(torch.bfloat16))


@needs_affected
@pytest.mark.parametrize("zero3", [True, False])
def test_peft_model_adapters_cast_only_under_zero3(monkeypatch, caplog, zero3):
    import logging

    from trl_compat.patches import zero3_peft_mixed_dtype as patch

    import torch
    from peft import LoraConfig, get_peft_model

    import tiny

    monkeypatch.setattr(patch, "_zero3_enabled", lambda: zero3)
    model = get_peft_model(
        tiny.make_model("qwen2").to(torch.bfloat16), LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM")
    )
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    assert {p.dtype for p in lora.values()} == {torch.float32}  # peft's autocast_adapter_dtype default
    values = {n: p.detach().clone() for n, p in lora.items()}
    with caplog.at_level(logging.WARNING, logger=patch.__name__):
        patch._before_init(None, {"model": model, "args": None})
    lora = {n: p for n, p in model.named_parameters() if "lora_" in n}
    if zero3:
        assert {p.dtype for p in lora.values()} == {torch.bfloat16}
        assert all(torch.equal(lora[n].float(), values[n].to(torch.bfloat16).float()) for n in lora)
        assert all(p.requires_grad for p in lora.values()) and "4 fp32 adapter parameters" in caplog.text, caplog.text
    else:
        assert {p.dtype for p in lora.values()} == {torch.float32} and not caplog.text


@needs_affected
@needs_peft_config_bug
def test_first_step_fails_without_patch(model_dir, tmp_path):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", marker="Z3|", disable=PATCH_ID)
    assert run.returncode != 0 and not run.of("done"), run.tail()
    for adapters in run.per_rank("adapters"):
        assert adapters["lora"] == ["torch.float32"] and adapters["base"] == ["torch.bfloat16"], adapters
    # Raised by DeepSpeed's _allgather_params_coalesced at the first gather of the whole model: on the CPU that is
    # TRL's unwrap_model_for_generation (GatheredParameters) before the first generation; on GPUs without a
    # generation gather it is the first optimizer step's re-gather of the persistent parameters (TRL #6089).
    assert GLOO_ERROR in run.output and "got TensorOptions(dtype=c10::BFloat16" in run.output, run.tail()
    assert "in _allgather_params_coalesced" in run.output, run.tail()
    assert not run.of("train"), run.tail()


@needs_affected
@pytest.mark.parametrize("peft_model", [False, True], ids=["peft_config", "peft_model"])
def test_lora_trains_with_patch(model_dir, tmp_path, peft_model):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", *(["--peft-model"] if peft_model else []), marker="Z3|")
    assert run.returncode == 0, run.tail()
    assert [e["status"] for e in run.per_rank("versions")] == ["applied", "applied"], run.tail()
    for adapters in run.per_rank("adapters"):
        assert adapters["lora"] == ["torch.bfloat16"] and adapters["base"] == ["torch.bfloat16"], adapters
    for train in run.per_rank("train"):
        assert len(train["losses"]) == 2, train
        assert train["changed"] and len(train["changed"]) == train["count"], train  # every LoRA weight trained
    assert GLOO_ERROR not in run.output and TYPE_ERROR not in run.output


@needs_affected
def test_peft_model_fails_without_patch(model_dir, tmp_path):
    """The path TRL 1.7's fix left: the user's own PeftModel (fp32 adapters on a bf16 model built under ZeRO-Init)."""
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", "--peft-model", marker="Z3|", disable=PATCH_ID)
    assert run.returncode != 0 and not run.of("done"), run.tail()
    for adapters in run.per_rank("adapters"):
        assert adapters["lora"] == ["torch.float32"] and adapters["base"] == ["torch.bfloat16"], adapters
    assert GLOO_ERROR in run.output and "in _allgather_params_coalesced" in run.output, run.tail()
    assert not run.of("train"), run.tail()
