"""lm-head-fp32-sharded: ``cast_lm_head_to_fp32=True`` under ZeRO-3 / FSDP with bf16 (TRL 0.25.0 - 1.8.x).

In-process: the probe on the installed TRL and on code written here; the module walk on modules built
here (TRL's hook recognised by name and module, a PEFT-like head left alone, a copy of the model
computing with its own weights); a real trainer of the installed TRL whose LM heads (policy and
reference) are then handed a bf16 weight, as a ZeRO-3 gather or FSDP's mixed precision hands it: with
the patch reverted TRL's head raises ``float != c10::BFloat16``, with it the logits are the fp32
product of that weight, and with an fp32 weight they are TRL's own, bit for bit. 2 processes
(tests/support/zero3_lm_head_worker.py under ``torch.distributed.run``, gloo, DeepSpeed's CPU
accelerator), one launch: a real ZeRO-3 GRPO step in bf16 with the patch (the heads get their gathered
bf16 weights and compute in fp32; the head trains), then a trainer built with the patch reverted, whose
first generation fails with the dtype mismatch (about 1 - 2 minutes on 2 cores).
"""

import copy
import importlib.util
import os
import re
import textwrap

import pytest
from packaging.version import Version

import written_code
from cells import only_in_cells
from unpatched import without_patch
from versions import installed
from workers import launch_two

PATCH_ID = "lm-head-fp32-sharded"
TRL = installed("trl")
IN_WINDOW = TRL is not None and Version("0.25.0") <= TRL < Version("1.9.0")
MISMATCH = re.compile(r"same dtype, but got: float != c10::BFloat16")
needs_trl = pytest.mark.skipif(TRL is None, reason="needs trl")
needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
needs_window = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL} outside 0.25.0 - 1.8.x")
needs_zero3 = pytest.mark.skipif(
    not IN_WINDOW or importlib.util.find_spec("deepspeed") is None, reason=f"needs deepspeed and TRL 0.25 - 1.8 (here {TRL})"
)


# -- probe -------------------------------------------------------------------------------------


@needs_trl
def test_probe_on_installed_trl():
    from trl_compat.patches import lm_head_fp32_sharded as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    if IN_WINDOW:
        assert verdict.needed is True and "float != c10::BFloat16" in verdict.reason, verdict
    elif TRL >= Version("1.9.0"):
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict
    else:
        assert verdict.needed is False and "no cast_lm_head_to_fp32" in verdict.reason, verdict


# TRL 0.25.0 - 1.8.x
BUGGY = """\
if args.cast_lm_head_to_fp32:
    def _cast_lm_head_to_fp32(target_model):
        def cast_inputs_to_fp32(module, inputs):
            if not inputs:
                return inputs
            return (inputs[0].to(torch.float32),) + inputs[1:]
        original_dtype_local = target_model.lm_head.weight.dtype
        target_model.lm_head = target_model.lm_head.float()
        target_model.lm_head.register_forward_pre_hook(cast_inputs_to_fp32)
    _cast_lm_head_to_fp32(model)
"""
# the first 0.25.0.dev0 builds (PR #4303, before #4446)
FIRST = """\
if args.cast_lm_head_to_fp32:
    if not model.config.tie_word_embeddings:
        def cast_inputs_to_fp32(module, input):
            return (input[0].float(),)
        model.lm_head = model.lm_head.float()
        model.lm_head.register_forward_pre_hook(cast_inputs_to_fp32)
"""
# PR #6330 (1.9.0)
FIXED = """\
if args.cast_lm_head_to_fp32:
    def _cast_lm_head_to_fp32(target_model):
        lm_head = target_model.lm_head.float()
        target_model.lm_head = lm_head
        def cast_forward_to_fp32(hidden_states):
            return nn.functional.linear(hidden_states.to(torch.float32), lm_head.weight.to(torch.float32), None)
        lm_head.forward = cast_forward_to_fp32
    _cast_lm_head_to_fp32(model)
"""


def _module(tmp_path, init_body):
    path = tmp_path / "fake_grpo.py"
    path.write_text("class GRPOTrainer:\n    def __init__(self, model, args):\n" + textwrap.indent(init_body, " " * 8) + "\n")
    return written_code.load(path)


@pytest.mark.parametrize(
    "body, expected",
    [
        (BUGGY, True),
        (FIRST, True),
        (FIXED, False),
        ("self.model = model\n", False),  # TRL < 0.25: no such option
        # the option, cast some other way
        ("if args.cast_lm_head_to_fp32:\n    model.lm_head.to(torch.float32)\n", None),
    ],
    ids=["0.25-1.8", "0.25.0.dev0", "1.9.0", "no-option", "unknown"],
)
def test_probe_on_written_code(tmp_path, body, expected):
    from trl_compat.patches import lm_head_fp32_sharded as patch

    assert patch.probe(_module(tmp_path, body)).needed is expected


# -- the module walk, on modules built here ------------------------------------------------------------


def _trl_hook(module_name):
    def cast_inputs_to_fp32(module, inputs):
        return (inputs[0].float(),) + inputs[1:]

    cast_inputs_to_fp32.__module__ = module_name
    return cast_inputs_to_fp32


def _tiny_lm(module_name="fake_grpo"):
    import torch

    class LoraLike(torch.nn.Module):  # a PEFT adapter's layer: not an nn.Linear
        def __init__(self):
            super().__init__()
            self.base_layer = torch.nn.Linear(4, 6)

        def forward(self, x):
            return self.base_layer(x)

    torch.manual_seed(0)
    model = torch.nn.ModuleDict(
        {
            "lm_head": torch.nn.Linear(4, 6),
            "other_hooked": torch.nn.Linear(4, 6),  # a pre-hook of another name
            "adapter_head": LoraLike(),
        }
    )
    model["lm_head"].register_forward_pre_hook(_trl_hook(module_name))
    model["other_hooked"].register_forward_pre_hook(lambda module, inputs: inputs)
    model["adapter_head"].register_forward_pre_hook(_trl_hook(module_name))
    return model


@needs_torch
def test_walk_casts_trls_hooked_linears_only():
    from trl_compat.patches import lm_head_fp32_sharded as patch

    import torch

    model = _tiny_lm()
    assert patch.cast_heads(model, "another_module") == (0, [])  # TRL's name, another module: not TRL's hook
    assert patch.cast_heads(model, "fake_grpo") == (1, ["LoraLike"])
    assert patch.cast_heads(model, "fake_grpo") == (0, ["LoraLike"])  # once only
    assert "forward" not in vars(model["other_hooked"]) and "forward" not in vars(model["adapter_head"])
    head, x = model["lm_head"], torch.randn(3, 4)
    head.weight.data = head.weight.data.to(torch.bfloat16)  # what a ZeRO-3 gather hands it
    expected = torch.nn.functional.linear(x, head.weight.float(), head.bias.float())
    out = head(x)
    assert out.dtype == torch.float32 and torch.equal(out, expected)


@needs_torch
def test_a_copy_of_the_model_computes_with_its_own_weights():
    """The forward is bound to its module: deepcopy binds the copy's forward to the copied head (a closure over
    the head, as TRL 1.9's, would keep computing with the original's weights)."""
    from trl_compat.patches import lm_head_fp32_sharded as patch

    import torch

    model = _tiny_lm()
    patch.cast_heads(model, "fake_grpo")
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin["lm_head"].weight.mul_(2.0)
    x = torch.randn(3, 4)
    assert torch.equal(twin["lm_head"](x), torch.nn.functional.linear(x, twin["lm_head"].weight, twin["lm_head"].bias))
    assert not torch.equal(twin["lm_head"](x), model["lm_head"](x))


# -- a real trainer of the installed TRL, its heads handed a bf16 weight -----------------------------------


def _trainer(tmp_path, label):
    import grpo_run
    import tiny

    # beta > 0: TRL casts the reference model's head too
    return grpo_run.make_trainer(tmp_path / label, model=tiny.make_model("qwen2"), cast_lm_head_to_fp32=True, beta=0.1)


def _heads(trainer):
    ref = getattr(trainer.ref_model, "module", trainer.ref_model)
    return {"policy": trainer.model, "ref": ref}


def _logits(model, ids):
    import torch

    with torch.no_grad():
        return model(input_ids=ids).logits


def _hidden(model, ids):
    import torch

    with torch.no_grad():
        return model.model(input_ids=ids).last_hidden_state


@needs_window
def test_bf16_weight_crashes_unpatched_and_computes_in_fp32_patched(tmp_path):
    import torch

    with without_patch(PATCH_ID):
        unpatched = _trainer(tmp_path, "unpatched")
    patched = _trainer(tmp_path, "patched")
    ids = torch.tensor([[5, 17, 42, 99, 7], [3, 8, 250, 11, 64]])
    for name in ("policy", "ref"):
        plain, fixed = _heads(unpatched)[name], _heads(patched)[name]
        assert plain.lm_head.weight.dtype == fixed.lm_head.weight.dtype == torch.float32
        # an fp32 weight (one process, DDP): the patched head computes what TRL's does, bit for bit
        assert torch.equal(_logits(fixed, ids), _logits(plain, ids)), name
        # the weight a ZeRO-3 gather (its shard stayed bf16) or FSDP's bf16 mixed precision hands the head
        for model in (plain, fixed):
            model.lm_head.weight.data = model.lm_head.weight.data.to(torch.bfloat16)
        with pytest.raises(RuntimeError, match=MISMATCH):
            _logits(plain, ids)
        logits = _logits(fixed, ids)
        expected = torch.nn.functional.linear(_hidden(fixed, ids).float(), fixed.lm_head.weight.float())
        assert logits.dtype == torch.float32 and torch.equal(logits, expected), name


# -- 2 processes, real ZeRO-3 in bf16 ------------------------------------------------------------


@needs_zero3
@only_in_cells(
    "trl1.0.0-tf4.57.6-ds0.19.2",
    why="2 ZeRO-3 processes, 1 - 2 minutes: TRL's cast and the patch's path under DeepSpeed are the same in the window",
)
def test_zero3_bf16_crashes_unpatched_and_trains_patched(tmp_path):
    import torch

    import tiny

    model_dir = tiny.save_tiny(tmp_path / "tiny_qwen2_bf16", model=tiny.make_model("qwen2").to(torch.bfloat16))
    run = launch_two("zero3_lm_head_worker.py", model_dir, os.fspath(tmp_path / "out"), marker="Z3|")
    assert run.returncode == 0 and len(run.of("done")) == 2, run.tail()
    assert {e["status"] for e in run.per_rank("versions")} == {"applied"}, run.tail()
    for heads in run.of("heads"):  # TRL's .float() turned the empty placeholder fp32; the shard stayed bf16
        for head in (heads["policy"], heads["ref"]):
            assert head == {"placeholder": "torch.float32", "placeholder_numel": 0, "shard": "torch.bfloat16"}, heads
    # with the patch: every call of either head got the gathered bf16 weight and computed in fp32 from it
    for calls in run.per_rank("calls"):
        assert calls["policy"]["calls"] >= 2 and calls["ref"]["calls"] >= 1, calls  # generation, log-prob forwards
        for head in (calls["policy"], calls["ref"]):
            assert head["weight"] == ["torch.bfloat16"] and head["output"] == ["torch.float32"], calls
            assert head["max_diff"] == 0.0, calls
    for train in run.per_rank("train"):
        assert len(train["losses"]) == 1 and train["head_changed"] is True, train
    # the patch reverted: TRL's head multiplies fp32 hidden states by the gathered bf16 weight at the first generation
    for unpatched in run.per_rank("unpatched"):
        error = unpatched["error"]
        assert error is not None and MISMATCH.search(error["error"]), unpatched
        assert error["error"].startswith("RuntimeError") and ".generate(" in error["traceback"], unpatched
        assert unpatched["status"] == "applied", unpatched
