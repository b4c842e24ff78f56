"""peft-zero3-gc-reentrant: PEFT + ZeRO-3 + gradient checkpointing, TRL 0.27.0 - 1.8.x.

In-process: the probe on the installed TRL and on code written here; the ``__init__`` hook's decisions
on given arguments. 2 processes (tests/support/zero3_lora_worker.py ``--partitioned`` under
``torch.distributed.run``, gloo, DeepSpeed's CPU accelerator): a real ZeRO-3 GRPO run with LoRA on a
tiny Qwen2 whose every parameter is partitioned, gradient checkpointing at GRPO's default (on); without
the patch the first backward raises torch's CheckpointError, with it the LoRA weights train.
"""

import importlib.util
import logging
import math
from types import SimpleNamespace

import pytest
from packaging.version import Version

import written_code
from versions import installed
from workers import launch_two

PATCH_ID = "peft-zero3-gc-reentrant"
CHECKPOINT_ERROR = "torch.utils.checkpoint.CheckpointError"
METADATA = "Recomputed values for the following tensors have different metadata than during the forward pass"
TRL, DS, PEFT = installed("trl"), installed("deepspeed"), installed("peft")
AFFECTED = (
    TRL is not None
    and DS is not None
    and PEFT is not None
    and importlib.util.find_spec("deepspeed") is not None
    and Version("0.27.0") <= TRL < Version("1.9.0")
)
needs_affected = pytest.mark.skipif(
    not AFFECTED, reason=f"only TRL 0.27.0 - 1.8.x with DeepSpeed and peft (here trl {TRL}, deepspeed {DS})"
)
needs_trl = pytest.mark.skipif(TRL is None, reason="needs trl")


# -- probe -------------------------------------------------------------------------------------


@needs_trl
def test_probe_on_installed_trl():
    from trl_compat.patches import peft_zero3_gc_reentrant as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    if TRL < Version("0.27.0") or TRL >= Version("1.9.0"):
        # before 0.27 the same code is judged "needed" too, but the gate keeps it out: checkpointing was reentrant
        if TRL >= Version("1.9.0"):
            assert verdict.needed is False and "forces use_reentrant=True" in verdict.reason, verdict
    else:
        assert verdict.needed is True and "CheckpointError" in verdict.reason, verdict


def _module(tmp_path, init_body):
    import textwrap

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        "class GRPOTrainer:\n    def __init__(self, model, args, peft_config=None):\n" + textwrap.indent(init_body, " " * 8) + "\n"
    )
    module = written_code.load(path)
    return module


@pytest.mark.parametrize(
    "body, expected",
    [
        # TRL 0.28 - 1.8
        (
            "if args.gradient_checkpointing:\n    args.gradient_checkpointing_kwargs = args.gradient_checkpointing_kwargs or {}\n"
            "    args.gradient_checkpointing_kwargs.setdefault('use_reentrant', False)",
            True,
        ),
        # TRL 1.9.0 (#6356)
        (
            "if args.gradient_checkpointing and args.deepspeed_plugin.zero_stage == 3:\n"
            "    args.gradient_checkpointing_kwargs = args.gradient_checkpointing_kwargs or {}\n"
            '    args.gradient_checkpointing_kwargs["use_reentrant"] = True  # forced',
            False,
        ),
        ("self.model = model", None),
    ],
)
def test_probe_on_written_code(tmp_path, body, expected):
    from trl_compat.patches import peft_zero3_gc_reentrant as patch

    assert patch.probe(_module(tmp_path, body)).needed is expected


# -- the hook's decisions ----------------------------------------------------------------------------


def _args(stage=3, gc=True, kwargs=None):
    plugin = None if stage is None else SimpleNamespace(zero_stage=stage)
    return SimpleNamespace(deepspeed_plugin=plugin, gradient_checkpointing=gc, gradient_checkpointing_kwargs=kwargs)


@pytest.mark.parametrize(
    "args, peft_config, kwargs_after",
    [
        (_args(), "lora", {"use_reentrant": True}),  # transformers 5: TRL leaves the kwargs None
        (_args(kwargs={"use_reentrant": False}), "lora", {"use_reentrant": True}),  # TRL 0.27's GRPOConfig, or the user
        (_args(kwargs={"use_reentrant": True, "x": 1}), "lora", {"use_reentrant": True, "x": 1}),
        (_args(stage=2, kwargs={"use_reentrant": False}), "lora", {"use_reentrant": False}),  # ZeRO-2: parameters whole
        (_args(stage=None), "lora", None),  # no DeepSpeed
        (_args(gc=False), "lora", None),
        (_args(kwargs={"use_reentrant": False}), None, {"use_reentrant": False}),  # no PEFT
    ],
)
def test_hook_sets_reentrant_only_for_peft_zero3_gc(args, peft_config, kwargs_after):
    from trl_compat.patches import peft_zero3_gc_reentrant as patch

    patch._before(None, {"model": "path", "args": args, "peft_config": peft_config})
    assert args.gradient_checkpointing_kwargs == kwargs_after


def test_hook_warns_when_false_is_overridden(caplog):
    from trl_compat.patches import peft_zero3_gc_reentrant as patch

    class PeftModel:  # an already-wrapped model, recognised by its class name as peft's is
        pass

    args = _args(kwargs={"use_reentrant": False})
    with caplog.at_level(logging.WARNING, logger=patch.__name__):
        patch._before(None, {"model": PeftModel(), "args": args, "peft_config": None})
    assert args.gradient_checkpointing_kwargs == {"use_reentrant": True}
    assert any("use_reentrant" in r.getMessage() and PATCH_ID in r.getMessage() for r in caplog.records), caplog.text


# -- 2 processes, real ZeRO-3 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch

    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("zero3_gc") / "tiny_qwen2_bf16", model=tiny.make_model("qwen2").to(torch.bfloat16))


@needs_affected
def test_first_backward_fails_without_patch(model_dir, tmp_path):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", "--partitioned", marker="Z3|", disable=PATCH_ID)
    assert run.returncode != 0 and not run.of("done"), run.tail()
    for adapters in run.per_rank("adapters"):
        assert adapters["gradient_checkpointing"] is True, adapters
        # TRL's own default on transformers < 5; transformers 5's when TRL leaves the kwargs unset
        assert (adapters["gradient_checkpointing_kwargs"] or {}).get("use_reentrant", False) is False, adapters
    assert CHECKPOINT_ERROR in run.output and METADATA in run.output, run.tail()
    assert "'shape': torch.Size([0])" in run.output, run.tail()  # a released ZeRO-3 parameter, recomputed
    assert not run.of("train"), run.tail()


@needs_affected
def test_lora_trains_with_patch(model_dir, tmp_path):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", "--partitioned", marker="Z3|")
    assert run.returncode == 0, run.tail()
    assert [e["gc_status"] for e in run.per_rank("versions")] == ["applied", "applied"], run.tail()
    for adapters in run.per_rank("adapters"):
        assert adapters["gradient_checkpointing"] is True and adapters["gradient_checkpointing_kwargs"]["use_reentrant"] is True
    for train in run.per_rank("train"):
        assert len(train["losses"]) == 2 and all(math.isfinite(x) for x in train["losses"]), train
        assert train["changed"] and len(train["changed"]) == train["count"], train  # every LoRA weight trained
    assert CHECKPOINT_ERROR not in run.output
