"""ref-model-like-policy: with beta > 0 the reference model is loaded like the policy passed in (TRL 0.26 - 1.15).

In-process: the probe on the installed TRL and on code written here; the loader wrapper's decisions on a
stand-in module. A real GRPO run on the CPU: a tiny Qwen2 saved in float32, passed as an instance in
bf16 with eager attention and ``beta=0.1``; with the patch reverted TRL reloads the reference in float32
with sdpa and the KL of the first step (policy == reference) is not zero; with it, the reference's
weights are the policy's, bit for bit, and that KL is 0. 2 processes
(tests/support/zero3_ref_dtype_worker.py under ``torch.distributed.run``, gloo, DeepSpeed's CPU
accelerator): a real ZeRO-3 run in bf16, where ``zero.Init`` already makes the reference bf16 and only the
attention implementation differs without the patch; with it the reference is the policy's (about 1-2
minutes on 2 cores).
"""

import importlib.util
import os
import textwrap
import types

import pytest
from packaging.version import Version

import written_code
from cells import only_in_cells
from versions import installed
from workers import launch_two

PATCH_ID = "ref-model-like-policy"
TRL = installed("trl")
IN_WINDOW = TRL is not None and Version("0.26.0") <= TRL < Version("1.16.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="needs trl")
needs_window = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL} outside 0.26.0 - 1.15.x")
# TRL 1.15's fused LM head: the policy's and the reference's step-1 forwards differ by bf16 rounding (a KL
# of about 8e-7 with or without the fix), so there the reference's dtype, attention and weights are the
# measure; before it the fix makes the KL exactly 0
KL_MEASURES = TRL is not None and TRL < Version("1.15.0")
needs_zero3 = pytest.mark.skipif(
    not IN_WINDOW or importlib.util.find_spec("deepspeed") is None, reason=f"needs deepspeed and TRL 0.26 - 1.15 (here {TRL})"
)


# -- probe -------------------------------------------------------------------------------------


@needs_trl
def test_probe_on_installed_trl():
    from trl_compat.patches import ref_model_like_policy as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    if IN_WINDOW:
        assert verdict.needed is True and "float32" in verdict.reason, verdict
    elif TRL >= Version("1.16.0"):
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict
    else:  # 0.19 - 0.25 load it with from_pretrained, 0.14 - 0.18 too under ZeRO-3: the bug, not corrected here
        assert verdict.needed is None and "from_pretrained" in verdict.reason, verdict


BUGGY = "self.ref_model = create_model_from_path(get_config_model_id(self.model.config), **model_init_kwargs)"
FIXED = (
    'model_init_kwargs.setdefault("dtype", self.model.dtype)\n'
    'model_init_kwargs.setdefault("attn_implementation", self.model.config._attn_implementation)\n' + BUGGY
)


def _module(tmp_path, init_body, helpers=True):
    path = tmp_path / "fake_grpo.py"
    functions = "def create_model_from_path(model_id, **kwargs):\n    return kwargs\n\n" if helpers else ""
    functions += "def get_config_model_id(config):\n    return config._name_or_path\n\n" if helpers else ""
    path.write_text(
        functions + "class GRPOTrainer:\n    def __init__(self, model, args):\n"
        "        model_init_kwargs = dict(args.model_init_kwargs or {})\n" + textwrap.indent(init_body, " " * 8) + "\n"
    )
    module = written_code.load(path)
    return module


@pytest.mark.parametrize(
    "body, helpers, expected",
    [
        (BUGGY, True, True),  # TRL 0.26.0 - 1.15.x
        (FIXED, True, False),  # TRL 1.16.0
        (BUGGY, False, None),  # the line, but not the module's functions
        ("self.ref_model = architecture.from_pretrained(model_id, **model_init_kwargs)", True, None),  # TRL 0.20 - 0.25
        ("self.ref_model = copy.deepcopy(model)", True, None),
    ],
)
def test_probe_on_written_code(tmp_path, body, helpers, expected):
    from trl_compat.patches import ref_model_like_policy as patch

    assert patch.probe(_module(tmp_path, body, helpers)).needed is expected


# -- the loader wrapper, on a stand-in module ----------------------------------------------------------


def test_the_loader_wrapper_adds_the_policys_defaults_to_the_reference_call_only():
    from trl_compat.patches import ref_model_like_policy as patch

    bf16 = "the policy's dtype"  # the wrapper hands it on as it is: no torch needed here (notrl runs this too)
    module = types.SimpleNamespace(get_config_model_id=lambda config: config._name_or_path)
    loader = patch._wrap_loader(module)(lambda model_id, architecture=None, **kwargs: (model_id, kwargs))
    config = types.SimpleNamespace(_name_or_path="/ckpt", _attn_implementation="eager")
    policy = types.SimpleNamespace(dtype=bf16, config=config)
    trainer = type("Trainer", (), {})()  # weakly referenced, as a GRPOTrainer

    patch._begin(trainer, {})
    try:
        # before Trainer.__init__ set self.model: the policy's own load from a path
        assert loader("/ckpt", dtype="float32") == ("/ckpt", {"dtype": "float32"})
        trainer.model = policy
        assert loader("/ckpt", device_map=None) == (
            "/ckpt",
            {"device_map": None, "dtype": bf16, "attn_implementation": "eager"},
        )
        assert loader(model_id="/ckpt") == ("/ckpt", {"dtype": bf16, "attn_implementation": "eager"})
        # the user's model_init_kwargs stand (1.16.0's setdefault), under either dtype name
        assert loader("/ckpt", dtype="float32", attn_implementation="sdpa") == (
            "/ckpt",
            {"dtype": "float32", "attn_implementation": "sdpa"},
        )
        assert loader("/ckpt", torch_dtype="float32") == ("/ckpt", {"torch_dtype": "float32", "attn_implementation": "eager"})
        assert loader("/other") == ("/other", {})  # not the policy's checkpoint
    finally:
        patch._end(trainer, {})
    assert loader("/ckpt") == ("/ckpt", {})  # no trainer being built


# -- a real GRPO run on the CPU -------------------------------------------------------------------------


def _bf16_policy(tmp_path):
    """A tiny Qwen2 saved in float32, and the same model in bf16 with eager attention, pointing at it."""
    import torch

    import tiny

    path = tiny.save_tiny(tmp_path / "tiny-fp32", "qwen2")
    policy = tiny.make_model("qwen2", attn_implementation="eager").to(torch.bfloat16)
    policy.config._name_or_path = path
    return policy


def _first_step(tmp_path, **overrides):
    """``((reference dtype, its attention), whether its weights are the policy's, the KL of step 1)`` of a
    1-step run with beta=0.1 on the bf16 policy."""
    import torch

    from grpo_run import make_trainer

    trainer = make_trainer(tmp_path, model=_bf16_policy(tmp_path), beta=0.1, steps=1, **overrides)
    ref = trainer.ref_model
    description = (ref.dtype, ref.config._attn_implementation)
    policy = dict(trainer.model.named_parameters())
    same = all(torch.equal(p, policy[n]) for n, p in ref.named_parameters())
    trainer.train()
    kl = [e["kl"] for e in trainer.state.log_history if "kl" in e]
    return description, same, kl[0]


@needs_window
def test_bug_by_value_unpatched(tmp_path):
    """Without the patch: a float32 reference with transformers' default attention, and a KL at step 1."""
    import torch

    from unpatched import without_patch

    with without_patch(PATCH_ID):
        (dtype, attention), _, kl = _first_step(tmp_path)
    assert dtype == torch.float32 and attention == "sdpa", (dtype, attention)
    # 8.7e-05 on the tiny Qwen2: the reference is not the policy (patched: exactly 0)
    assert kl > 0.0 or not KL_MEASURES, kl


@needs_window
def test_fix_builds_the_reference_like_the_policy(tmp_path):
    import trl_compat

    import torch
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch applies on its import

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    (dtype, attention), same, kl = _first_step(tmp_path)
    assert dtype == torch.bfloat16 and attention == "eager", (dtype, attention)
    assert same  # the bf16 load of the float32 checkpoint is the policy's cast, bit for bit
    assert kl == 0.0 if KL_MEASURES else kl < 1e-5, kl


@needs_window
def test_the_users_model_init_kwargs_stand(tmp_path):
    """An explicit dtype in model_init_kwargs (TRL only warns that an instance ignores them) still builds the reference."""
    import torch

    (dtype, attention), _, _ = _first_step(tmp_path, model_init_kwargs={"dtype": "float32"})
    assert dtype == torch.float32 and attention == "eager"


# -- 2 processes, real ZeRO-3 in bf16 ------------------------------------------------------------


@needs_zero3
@only_in_cells(
    "trl1.9.2-tf5.14.1-ds0.19.3",
    why="2 ZeRO-3 processes, 1 - 2 minutes: the patch's path under DeepSpeed is the same in the window",
)
def test_zero3_reference_is_built_like_the_policy(tmp_path):
    import torch

    import tiny

    model_dir = tiny.save_tiny(tmp_path / "tiny_qwen2_bf16", model=tiny.make_model("qwen2").to(torch.bfloat16))
    run = launch_two("zero3_ref_dtype_worker.py", model_dir, os.fspath(tmp_path / "out"), marker="Z3|")
    assert run.returncode == 0, run.tail()
    assert {e["status"] for e in run.per_rank("versions")} == {"applied"}, run.tail()
    for models in run.per_rank("models"):
        assert models["policy"] == models["ref"] == ["torch.bfloat16"], models
        assert models["policy_attn"] == models["ref_attn"] == "eager", models  # TRL alone: "sdpa"
    for train in run.per_rank("train"):
        assert train["kl"][0] == 0.0, train
