"""dora-magnitude-bf16: QLoRA + DoRA, the magnitude vectors cast to bf16 by GRPOTrainer (TRL 0.26.0 - 1.14.x;
fixed in 1.15.0).

No bitsandbytes on the CPU: a tiny model gets ``is_loaded_in_4bit = True`` by hand (as TRL's own QLoRA
tests do), then DoRA on q/v, as a PeftModel passed in or as a ``peft_config``; learning rate 1e-5 (an
ordinary one for GRPO).

* Affected cells, without the patch: after ``GRPOTrainer(...)`` the magnitude vectors are bf16 and a
  real GRPO run leaves them bit for bit as they were, while the LoRA B weights move.
* With it: the magnitude vectors passed in are the very fp32 values again (a peft_config's: fp32),
  and the same run changes them.
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


@pytest.mark.parametrize(
    "source, verdict",
    [
        # 0.26.0 - 1.14.x
        (
            "if getattr(model, 'is_loaded_in_4bit', False):\n            for param in model.parameters():\n"
            "                if param.requires_grad:\n                    param.data = param.data.to(torch.bfloat16)",
            True,
        ),
        # 1.15.0
        (
            "if model.is_loaded_in_4bit:\n            for name, param in model.named_parameters():\n"
            "                if param.requires_grad and 'lora_magnitude_vector' not in name:\n"
            "                    param.data = param.data.to(torch.bfloat16)",
            False,
        ),
        ("model = peft_module_casting_to_bf16(model)", None),
    ],
)
def test_probe_on_written_code(tmp_path, monkeypatch, source, verdict):
    import importlib.util
    import sys

    path = tmp_path / "fake_grpo_dora.py"
    path.write_text(f"import torch\nclass GRPOTrainer:\n    def __init__(self, model):\n        {source}\n")
    spec = importlib.util.spec_from_file_location("fake_grpo_dora", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "fake_grpo_dora", module)  # a class's source is found through its module
    spec.loader.exec_module(module)
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


def train(trainer):
    import grpo_run

    # the fake flag has done its part (TRL's cast); transformers' FLOPs count at train time would look for
    # bitsandbytes because of it
    trainer.model.get_base_model().is_loaded_in_4bit = False
    trainer.tiny_initial_trainable = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    return set(grpo_run.changed_trainable(trainer))


@needs_affected
def test_magnitudes_frozen_without_patch(tmp_path, unpatched):
    import grpo_run

    model = fake_4bit_dora_model()
    with unpatched(PATCH_ID):
        trainer = grpo_run.make_trainer(tmp_path, model=model, steps=3, learning_rate=LEARNING_RATE)
        magnitudes = named_magnitudes(trainer.model)
        assert magnitudes and {p.dtype for p in magnitudes.values()} == {torch.bfloat16}
        changed = train(trainer)
    assert not changed & set(magnitudes), changed  # not one magnitude entry moved in 3 steps
    assert any("lora_B" in n for n in changed), changed  # while the adapters did train


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
    changed = train(trainer)
    assert set(magnitudes) <= changed, changed


@needs_affected
def test_peft_config_magnitudes_train_with_patch(tmp_path):
    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, model=fake_4bit_model(), peft_config=dora_config(), steps=3, learning_rate=LEARNING_RATE)
    magnitudes = named_magnitudes(trainer.model)
    assert magnitudes and {p.dtype for p in magnitudes.values()} == {torch.float32}
    changed = train(trainer)
    assert set(magnitudes) <= changed, changed
