"""qlora-config-rebuild: on TRL 0.22.x every GRPO run on a 4/8-bit model dies in ``__init__``.

No bitsandbytes on the CPU: a tiny model gets ``is_loaded_in_4bit = True`` by hand and is passed
with a LoRA ``peft_config`` (the QLoRA recipe).

* Without the patch (TRL 0.22.x): ``ValueError: 'generation_batch_size' and 'steps_per_generation'
  can not be both configured at the same time`` (prepare_peft_model rebuilt the GRPOConfig).
* With it: the trainer is built, only the LoRA weights require grad, the trainer's config keeps
  its values, and a real GRPO run changes the LoRA weights.
* ``replace`` of the view: a copy with the change for a TrainingArguments, dataclasses' own
  otherwise; the probe on the cell's TRL and on code written here.
"""

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from trl_compat.patches import qlora_config_rebuild as qcr

from packaging.version import Version

from versions import installed

PID = "qlora-config-rebuild"
TRL = installed("trl")
BUGGY = TRL is not None and Version("0.22.0") <= TRL < Version("0.23.0")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} is outside 0.22.0 - 0.22.2")
# the window and 0.23.x; TRL 0.28 moved prepare_peft_model out of trl.models.utils
runs_here = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("0.24.0")), reason=f"TRL {TRL}: outside 0.22.0 - 0.23.x"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _fake_4bit_trainer(tmp_path):
    from peft import LoraConfig

    import grpo_run
    import tiny

    model = tiny.make_model("qwen2")
    model.is_loaded_in_4bit = True
    peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    return grpo_run.make_trainer(tmp_path, model=model, steps=1, peft_config=peft_config)


@needs_bug
def test_bug_without_the_patch_init_raises(tmp_path, unpatched):
    with unpatched(PID):
        with pytest.raises(ValueError, match="'generation_batch_size' and 'steps_per_generation' can not be both configured"):
            _fake_4bit_trainer(tmp_path)


@runs_here
def test_qlora_trains(tmp_path):
    import grpo_run

    trainer = _fake_4bit_trainer(tmp_path)
    trainable = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert trainer.args.generation_batch_size == 4 and trainer.args.steps_per_generation == 1
    # the fake flag has done its part; transformers' FLOPs count at train time would look for bitsandbytes
    trainer.model.get_base_model().is_loaded_in_4bit = False
    trainer.tiny_initial_trainable = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    changed = grpo_run.changed_trainable(trainer)
    assert changed and set(changed) <= trainable


@dataclasses.dataclass
class _Plain:
    a: int = 1
    b: int = 2


@pytest.mark.skipif(TRL is None, reason="builds a TRL config")
def test_replace_copies_training_arguments(tmp_path):
    import grpo_run

    config, _ = grpo_run.make_config(tmp_path, gradient_checkpointing=True)
    view = qcr.view()
    clone = view.replace(config, gradient_checkpointing=False)
    assert clone is not config and clone.gradient_checkpointing is False and config.gradient_checkpointing is True
    # copied, not rebuilt: the fields __post_init__ derives (generation_batch_size from 0.18) come along
    assert getattr(clone, "generation_batch_size", None) == getattr(config, "generation_batch_size", None)
    assert (clone.learning_rate, clone.max_steps) == (config.learning_rate, config.max_steps)
    assert view.replace(_Plain(), b=3) == _Plain(1, 3)
    assert view.fields is dataclasses.fields
    with pytest.raises(TypeError):
        view.replace(config, no_such_field=1)


@runs_here
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = qcr.probe(module)
    assert verdict.needed is BUGGY, verdict
    if not BUGGY:
        assert "fixed code" in verdict.reason


def _rebuilding(model, peft_config, args):
    args = dataclasses.replace(args, gradient_checkpointing=False)
    return model


def _fixed(model, peft_config, args):
    args.gradient_checkpointing = False
    return model


class _Rejecting:
    def __post_init__(self):
        raise ValueError("'generation_batch_size' and 'steps_per_generation' can not be both configured at the same time")


class _Accepting:
    def __post_init__(self):
        pass


@pytest.mark.skipif(TRL is None, reason="the probe reads trl.models.utils")
def test_probe_on_written_code(monkeypatch):
    import trl.models.utils as utils

    monkeypatch.setattr(utils, "dataclasses", dataclasses, raising=False)  # the module, not the patch's view
    monkeypatch.setattr(utils, "prepare_peft_model", _rebuilding, raising=False)
    assert qcr.probe(type("M", (), {"GRPOConfig": _Rejecting})).needed is True
    assert qcr.probe(type("M", (), {"GRPOConfig": _Accepting})).needed is False
    monkeypatch.setattr(utils, "prepare_peft_model", _fixed)
    assert qcr.probe(type("M", (), {"GRPOConfig": _Rejecting})).needed is False
