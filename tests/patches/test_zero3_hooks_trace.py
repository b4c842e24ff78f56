"""zero3-hooks-trace: TRL < 1.5.0 with DeepSpeed < 0.19.2, ZeRO-3 generation leaves a stale coordinator trace.

In-process: the probe on the installed TRL and DeepSpeed, and on code written here; the wrapper's
decisions on stand-in engines. 2 processes (tests/support/zero3_lora_worker.py ``--partitioned`` under
``torch.distributed.run``, gloo, DeepSpeed's CPU accelerator): a real ZeRO-3 GRPO run with LoRA on a tiny
Qwen2, two steps with transformers generation. Without the patch the first step trains and records
DeepSpeed's trace, the second generation renumbers the modules, and the second step's first forward dies
with ``IndexError: pop from an empty deque``; with it both steps train every LoRA weight.
"""

import importlib.util
import math
import os
import textwrap
from types import SimpleNamespace

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

PATCH_ID = "zero3-hooks-trace"
EMPTY_DEQUE = "IndexError: pop from an empty deque"
TRL, DS, PEFT = installed("trl"), installed("deepspeed"), installed("peft")
HAVE_DS = TRL is not None and DS is not None and importlib.util.find_spec("deepspeed") is not None
BUG_HERE = HAVE_DS and Version("0.14.0") <= TRL < Version("1.5.0") and DS < Version("0.19.2")
needs_ds = pytest.mark.skipif(not HAVE_DS, reason="needs trl and deepspeed")
needs_affected = pytest.mark.skipif(
    not (BUG_HERE and PEFT is not None),
    reason=f"only TRL 0.14.0 - 1.4.x with DeepSpeed < 0.19.2 and peft (here trl {TRL}, deepspeed {DS}, peft {PEFT})",
)
# The 2-process runs (about 70 s a cell) where the default run has them: the cell of the real multi-process
# launches (0.15's trainer) and the by-hand 1.4.0 cell (1.x's, where the bug was found); every other cell in
# the window checks the probe and the wrapper, and test_statuses that the patch applies.
TWO_PROCESS_CELLS = ("trl0.15.2-tf4.48.3", "trl1.4.0-tf5.5.4-ds0.19.1")
CELL = os.environ.get("TRL_COMPAT_CELL", "")
two_process_cell = pytest.mark.skipif(
    bool(CELL) and CELL not in TWO_PROCESS_CELLS,
    reason=f"the 2-process ZeRO-3 runs of zero3-hooks-trace run in {', '.join(TWO_PROCESS_CELLS)}",
)


# -- probe -------------------------------------------------------------------------------------


@needs_ds
def test_probe_on_installed_trl_and_deepspeed():
    from trl_compat.patches import zero3_hooks_trace as patch

    import trl.models.utils as utils

    verdict = patch.probe(utils)
    assert verdict.needed is BUG_HERE, verdict
    if TRL >= Version("1.5.0"):
        assert "TRL >= 1.5.0" in verdict.reason, verdict
    elif DS >= Version("0.19.2"):
        assert "DeepSpeed >= 0.19.2" in verdict.reason, verdict


def _module(tmp_path, body):
    path = tmp_path / "fake_utils.py"
    path.write_text("def add_hooks(model):\n" + textwrap.indent(body, " " * 4) + "\n")
    spec = importlib.util.spec_from_file_location("fake_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class OldOffload:  # DeepSpeed < 0.16.4
    def _register_hooks_recursively(self, module, count=[0]):  # noqa: B006 - DeepSpeed's own signature
        module.ds_id = count[0]


class Offload:  # DeepSpeed 0.16.4 - 0.19.1
    def _register_deepspeed_module(self, module, count=[0]):  # noqa: B006 - DeepSpeed's own signature
        module.ds_id = count[0]


class FixedOffload:  # DeepSpeed 0.19.2 (PR #8043)
    def _register_deepspeed_module(self, module, count=[0]):  # noqa: B006 - DeepSpeed's own signature
        module.ds_id = count[0]
        if module is self.module:
            coordinator = self.get_param_coordinator()
            if coordinator is not None and not coordinator.is_invalid_trace():
                coordinator._invalidate_trace()


OFFLOAD = "optimizer_offload = model.optimizer.parameter_offload\n"
TRL_14 = OFFLOAD + "optimizer_offload._register_deepspeed_module(optimizer_offload.module)"
TRL_15 = (
    OFFLOAD + "if hasattr(optimizer_offload, 'param_coordinator'):\n"
    "    coordinator = optimizer_offload.param_coordinator\n"
    "    if not coordinator.is_invalid_trace():\n"
    "        coordinator._invalidate_trace()\n"
    "optimizer_offload._register_deepspeed_module(optimizer_offload.module)"
)
TRL_014 = OFFLOAD + "optimizer_offload._register_hooks_recursively(optimizer_offload.module)"


@pytest.mark.parametrize(
    "body, offload, expected",
    [
        (TRL_14, Offload, True),  # TRL 0.16 - 1.4, DeepSpeed 0.16.4 - 0.19.1
        (TRL_014, OldOffload, True),  # TRL 0.14 - 0.15, DeepSpeed < 0.16.4
        (TRL_15, Offload, False),  # TRL 1.5.0 (#4693)
        (TRL_14, FixedOffload, False),  # DeepSpeed 0.19.2 (#8043)
        ("model.register_hooks_somehow()", Offload, None),  # the code moved
        # prose is not code: the fix named in a docstring and a comment only
        ('"""TRL 1.5 calls _invalidate_trace here."""\n# coordinator._invalidate_trace()\n' + TRL_14, Offload, True),
    ],
)
def test_probe_on_written_code(tmp_path, monkeypatch, body, offload, expected):
    from trl_compat._helpers import zero3
    from trl_compat.patches import zero3_hooks_trace as patch

    monkeypatch.setattr(zero3, "offload_class", lambda: offload)
    assert patch.probe(_module(tmp_path, body)).needed is expected


# -- the wrapper's decisions ----------------------------------------------------------------------


class Coordinator:
    def __init__(self, invalid):
        self.invalid, self.invalidations = invalid, 0

    def is_invalid_trace(self):
        return self.invalid

    def _invalidate_trace(self):
        assert not self.invalid, "DeepSpeed raises on invalidating an invalid trace"
        self.invalid, self.invalidations = True, self.invalidations + 1


def _engine(coordinator):
    return SimpleNamespace(optimizer=SimpleNamespace(parameter_offload=SimpleNamespace(param_coordinator=coordinator)))


@pytest.mark.parametrize("by_keyword", [False, True])
@pytest.mark.parametrize("invalid, invalidations", [(False, 1), (True, 0)])
def test_wrapper_invalidates_a_valid_trace_before_trl_reregisters(by_keyword, invalid, invalidations):
    from trl_compat.patches import zero3_hooks_trace as patch

    coordinator, seen = Coordinator(invalid), []

    def add_hooks(model):
        seen.append((model, coordinator.invalid))  # what TRL's add_hooks finds: the trace already invalid

    wrapped, engine = patch._wrap_add_hooks(add_hooks), _engine(coordinator)
    assert (wrapped(model=engine) if by_keyword else wrapped(engine)) is None
    assert seen == [(engine, True)] and coordinator.invalidations == invalidations


@pytest.mark.parametrize(
    "model",
    [
        SimpleNamespace(),  # a bare module (before the first step TRL's add_hooks returns early too)
        SimpleNamespace(optimizer=None),
        SimpleNamespace(optimizer=SimpleNamespace(parameter_offload=SimpleNamespace())),  # no coordinator: not ZeRO-3
    ],
)
def test_wrapper_leaves_what_has_no_coordinator(model):
    from trl_compat.patches import zero3_hooks_trace as patch

    seen = []

    def add_hooks(model):
        seen.append(model)

    patch._wrap_add_hooks(add_hooks)(model)
    assert seen == [model]


# -- 2 processes, real ZeRO-3 -------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import torch

    import tiny

    model = tiny.make_model("qwen2").to(torch.bfloat16)
    return tiny.save_tiny(tmp_path_factory.mktemp("zero3_trace") / "tiny_qwen2_bf16", model=model)


@needs_affected
@two_process_cell
def test_second_step_fails_without_patch(model_dir, tmp_path):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", "--partitioned", marker="Z3|", disable=PATCH_ID)
    assert run.returncode != 0 and not run.of("done"), run.tail()
    assert [e["trace_status"] for e in run.per_rank("versions")] == ["disabled", "disabled"], run.tail()
    assert EMPTY_DEQUE in run.output, run.tail()
    # DeepSpeed's coordinator building the parameter trace from the modules it recorded before the generation
    assert "construct_parameter_trace_from_module_trace" in run.output and "record_parameters" in run.output, run.tail()
    assert not run.of("train"), run.tail()


@needs_affected
@two_process_cell
def test_lora_trains_with_patch(model_dir, tmp_path):
    run = launch_two("zero3_lora_worker.py", model_dir, tmp_path / "out", "--partitioned", marker="Z3|")
    assert run.returncode == 0, run.tail()
    assert [e["trace_status"] for e in run.per_rank("versions")] == ["applied", "applied"], run.tail()
    for train in run.per_rank("train"):
        assert len(train["losses"]) == 2 and all(math.isfinite(x) for x in train["losses"]), train
        assert train["changed"] and len(train["changed"]) == train["count"], train  # every LoRA weight trained
    assert EMPTY_DEQUE not in run.output
