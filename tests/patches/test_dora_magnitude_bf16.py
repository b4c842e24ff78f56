"""dora-magnitude-bf16: QLoRA + DoRA, the magnitude vectors cast to bf16 by GRPOTrainer (TRL 0.26.0 - 1.14.x;
fixed in 1.15.0).

No bitsandbytes on the CPU: a tiny model gets ``is_loaded_in_4bit = True`` by hand (the flag is all TRL's
cast reads), then DoRA on q/v, as a PeftModel passed in or as a ``peft_config``; learning rate 1e-5 (an
ordinary one for GRPO), 3 steps.

* Affected cells, without the patch: after ``GRPOTrainer(...)`` the magnitude vectors are bf16 and a
  real GRPO run leaves them bit for bit as they were (largest change 0), while the LoRA B weights,
  bf16 too but starting at 0, move (about 2e-5).
* With it: the magnitude vectors passed in are the very fp32 values again (a peft_config's: fp32),
  and the same run moves every one of them (about 2e-5).
* TRL 1.15.0 on (the patch not needed): TRL itself leaves the magnitude vectors passed in as the patch
  leaves them, fp32 and the very values, the LoRA B weights bf16.
* The probe on the cell's TRL and on code written here.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import trl_compat
from trl_compat.patches import dora_magnitude_bf16 as patch_module

from packaging.version import Version

from versions import installed

PATCH_ID = "dora-magnitude-bf16"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("0.26.0") <= TRL < Version("1.15.0")
needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"TRL 0.26.0 - 1.14.x only (here trl {TRL})")
LEARNING_RATE = 1e-5


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


# GRPOTrainer.__init__'s QLoRA cast, as each release writes it (comments left out: the probe drops them)
CAST_0_26 = """
        if getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False):
            for param in model.parameters():
                if param.requires_grad:
                    param.data = param.data.to(torch.bfloat16)
"""
CAST_1_14 = """
        _is_quantized_model = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if _is_quantized_model:
            for param in model.parameters():
                if param.requires_grad:
                    param.data = param.data.to(torch.bfloat16)
"""
CAST_1_15 = """
        _is_quantized_model = getattr(model, "is_loaded_in_4bit", False) or getattr(model, "is_loaded_in_8bit", False)
        if _is_quantized_model:
            for name, param in model.named_parameters():
                if param.requires_grad and "lora_magnitude_vector" not in name:
                    param.data = param.data.to(torch.bfloat16)
"""
BEFORE_4577 = """
        if peft_config is not None:
            model = prepare_peft_model(model, peft_config, args)
"""
UNKNOWN_CAST = """
        if model.is_loaded_in_4bit:
            model = cast_adapters(model, torch.bfloat16)
"""


@pytest.mark.parametrize(
    "body, verdict",
    [(CAST_0_26, True), (CAST_1_14, True), (CAST_1_15, False), (BEFORE_4577, False), (UNKNOWN_CAST, None)],
    ids=["0.26.0", "1.14.2", "1.15.0", "before-pr-4577", "unknown-cast"],
)
def test_probe_on_written_code(code_module, body, verdict):
    module = code_module(f"import torch\n\n\nclass GRPOTrainer:\n    def __init__(self, model, peft_config=None, args=None):{body}")
    assert patch_module.probe(module).needed is verdict


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_real_trl():
    import trl.trainer.grpo_trainer as grpo

    verdict = patch_module.probe(grpo)
    assert verdict.needed is AFFECTED, verdict


# -- real GRPO runs ----------------------------------------------------------------------------


def dora_config():
    from peft import LoraConfig

    return LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], use_dora=True, task_type="CAUSAL_LM")


def fake_4bit_model():
    import tiny

    model = tiny.make_model("qwen2")
    model.is_loaded_in_4bit = True
    return model


def fake_4bit_dora_model():
    from peft import get_peft_model

    return get_peft_model(fake_4bit_model(), dora_config())


def named_magnitudes(model) -> dict[str, torch.nn.Parameter]:
    return {n: p for n, p in model.named_parameters() if "lora_magnitude_vector" in n}


def train(trainer) -> dict[str, float]:
    """Train ``trainer``; returns how far each trainable parameter moved (largest absolute change)."""
    import grpo_run

    # the fake flag has done its part (TRL's cast); transformers' FLOPs count at train time would look for
    # bitsandbytes because of it
    trainer.model.get_base_model().is_loaded_in_4bit = False
    before = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    after = grpo_run.trainable_snapshot(trainer)
    return {n: (after[n].double() - t.double()).abs().max().item() for n, t in before.items()}


def largest(moved: dict[str, float], part: str) -> float:
    return max(v for n, v in moved.items() if part in n)


@needs_affected
def test_magnitudes_frozen_without_patch(tmp_path, unpatched):
    import grpo_run

    model = fake_4bit_dora_model()
    with unpatched(PATCH_ID):
        trainer = grpo_run.make_trainer(tmp_path, model=model, steps=3, learning_rate=LEARNING_RATE)
        magnitudes = named_magnitudes(trainer.model)
        assert magnitudes and {p.dtype for p in magnitudes.values()} == {torch.bfloat16}
        moved = train(trainer)
    # not one magnitude entry moved in 3 steps, while the LoRA B weights (bf16 too) did train
    assert largest(moved, "lora_magnitude_vector") == 0.0, moved
    assert largest(moved, "lora_B") > 0.0, moved


@needs_affected
def test_magnitudes_kept_and_trained_with_patch(tmp_path):
    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    model = fake_4bit_dora_model()
    before = {n: p.detach().clone() for n, p in named_magnitudes(model).items()}
    assert before and {t.dtype for t in before.values()} == {torch.float32}
    trainer = grpo_run.make_trainer(tmp_path, model=model, steps=3, learning_rate=LEARNING_RATE)
    magnitudes = named_magnitudes(trainer.model)
    assert set(magnitudes) == set(before)
    for name, param in magnitudes.items():  # the very values passed in, as TRL 1.15 leaves them
        assert param.dtype == torch.float32 and torch.equal(param.detach(), before[name]), name
    assert {p.dtype for n, p in trainer.model.named_parameters() if "lora_B" in n} == {torch.bfloat16}  # TRL's cast stays
    moved = train(trainer)
    assert all(moved[n] > 0.0 for n in magnitudes), moved  # every magnitude vector trains


@needs_affected
def test_peft_config_magnitudes_train_with_patch(tmp_path):
    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, model=fake_4bit_model(), peft_config=dora_config(), steps=3, learning_rate=LEARNING_RATE)
    magnitudes = named_magnitudes(trainer.model)
    assert magnitudes and {p.dtype for p in magnitudes.values()} == {torch.float32}
    moved = train(trainer)
    assert all(moved[n] > 0.0 for n in magnitudes), moved


@pytest.mark.skipif(TRL is None or TRL < Version("1.15.0"), reason=f"TRL 1.15.0 on, the fixed cast (here trl {TRL})")
def test_the_fixed_release_leaves_the_magnitudes_as_the_patch_does(tmp_path):
    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.NOT_NEEDED, trl_compat.report()
    model = fake_4bit_dora_model()
    before = {n: p.detach().clone() for n, p in named_magnitudes(model).items()}
    trainer = grpo_run.make_trainer(tmp_path, model=model, steps=3, learning_rate=LEARNING_RATE)
    magnitudes = named_magnitudes(trainer.model)
    assert before and set(magnitudes) == set(before)
    for name, param in magnitudes.items():
        assert param.dtype == torch.float32 and torch.equal(param.detach(), before[name]), name
    assert {p.dtype for n, p in trainer.model.named_parameters() if "lora_B" in n} == {torch.bfloat16}
