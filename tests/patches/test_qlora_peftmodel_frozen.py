"""qlora-peftmodel-frozen: a 4/8-bit PeftModel passed to GRPO without peft_config cannot train (TRL 0.22.0 - 0.23.0).

No bitsandbytes on the CPU: a tiny model gets ``is_loaded_in_4bit = True`` by hand (as TRL's own
test of PR #4081 does), then ``get_peft_model`` with LoRA on q/v.

* Without the patch (TRL 0.22.x, and without qlora-config-rebuild): ``GRPOTrainer(model=<that
  PeftModel>)`` raises ``ValueError: 'generation_batch_size' and 'steps_per_generation' can not be
  both configured at the same time`` (the k-bit branch rebuilds the GRPOConfig). Without this patch
  only: the trainer's model has no parameter requiring grad and ``train()`` fails at the first
  backward (TRL 0.23.0's symptom); TRL's ``prepare_peft_model`` called with plain
  ``TrainingArguments`` returns the adapters frozen too.
* With it: the adapters still require grad after ``__init__`` and a real GRPO run changes them
  (and only them).
* The probe on the cell's TRL and on code written here.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from trl_compat.patches import qlora_peftmodel_frozen as qpf

from packaging.version import Version

from versions import installed

PID = "qlora-peftmodel-frozen"
TRL = installed("trl")
BUGGY = TRL is not None and Version("0.22.0") <= TRL < Version("0.23.1")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} is outside 0.22.0 - 0.23.0")
rebuilds_config = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("0.23.0")), reason=f"TRL {TRL}: only 0.22.x rebuilds the config"
)
# the window and 0.23.1, its first fixed release; TRL 0.28 moved prepare_peft_model out of trl.models.utils
needs_trl = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("0.24.0")), reason=f"TRL {TRL}: outside 0.22.0 - 0.23.1"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def fake_4bit_peft_model():
    from peft import LoraConfig, get_peft_model

    import tiny

    model = tiny.make_model("qwen2")
    model.is_loaded_in_4bit = True
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    assert getattr(peft_model, "is_loaded_in_4bit", False)
    lora = {n for n, p in peft_model.named_parameters() if p.requires_grad}
    assert lora and all("lora_" in n for n in lora)
    return peft_model, lora


def _trainer(tmp_path, model, steps=1):
    import grpo_run

    return grpo_run.make_trainer(tmp_path, model=model, steps=steps)  # no peft_config


@rebuilds_config
def test_bug_without_the_patch_init_raises(tmp_path, unpatched):
    model, _ = fake_4bit_peft_model()
    with unpatched(PID), unpatched("qlora-config-rebuild"):
        with pytest.raises(ValueError, match="'generation_batch_size' and 'steps_per_generation' can not be both configured"):
            _trainer(tmp_path, model)


@needs_bug
def test_bug_without_the_patch_nothing_trains(tmp_path, unpatched):
    # on 0.22.x qlora-config-rebuild gets __init__ past the ValueError: TRL 0.23.0's symptom remains
    model, _ = fake_4bit_peft_model()
    with unpatched(PID):
        trainer = _trainer(tmp_path, model)
        assert not [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        trainer.model.get_base_model().is_loaded_in_4bit = False  # see test_adapters_train
        before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
        try:
            trainer.train()
        except RuntimeError as error:  # no input requires grad either
            assert "does not require grad" in str(error)
        else:  # gradient checkpointing made the inputs require grad: the run goes on, training nothing
            assert all(torch.equal(p, before[n]) for n, p in trainer.model.named_parameters())


@needs_bug
def test_bug_without_the_patch_adapters_frozen(tmp_path, unpatched):
    import trl.models.utils as utils
    from transformers import TrainingArguments

    model, _ = fake_4bit_peft_model()
    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    with unpatched(PID):
        prepared = utils.prepare_peft_model(model, None, args)
    assert not [n for n, p in prepared.named_parameters() if p.requires_grad]


@needs_trl
def test_adapters_train(tmp_path):
    import grpo_run

    model, lora = fake_4bit_peft_model()
    trainer = _trainer(tmp_path, model)
    assert {n for n, p in trainer.model.named_parameters() if p.requires_grad} == lora
    # the fake flag has done its part (prepare_peft_model); transformers' FLOPs count at train time
    # would look for bitsandbytes because of it
    trainer.model.get_base_model().is_loaded_in_4bit = False
    trainer.tiny_initial_trainable = grpo_run.trainable_snapshot(trainer)
    trainer.train()
    changed = grpo_run.changed_trainable(trainer)
    assert changed and set(changed) <= lora


@needs_trl
def test_other_calls_run_trls_function(tmp_path):
    import trl.models.utils as utils
    from transformers import TrainingArguments

    import tiny

    args = TrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    plain = tiny.make_model("qwen2")  # not k-bit, no peft_config: TRL returns it as it is
    assert utils.prepare_peft_model(plain, None, args) is plain


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = qpf.probe(module)
    assert verdict.needed is BUGGY, verdict
    if not BUGGY:
        assert "fixed code" in verdict.reason


def _buggy(model, peft_config, args):
    if is_qlora and not is_sharded_qlora:  # noqa: F821 - read, never run
        model = prepare_model_for_kbit_training(model)  # noqa: F821
    return model


def _fixed(model, peft_config, args):
    if is_qlora and not is_sharded_qlora and not isinstance(model, PeftModel):  # noqa: F821
        model = prepare_model_for_kbit_training(model)  # noqa: F821
    return model


@pytest.mark.skipif(TRL is None, reason="the probe reads trl.models.utils")
def test_probe_on_written_code(monkeypatch):
    import trl.models.utils as utils

    class Calls:
        def __init__(self, model, peft_config, args):
            model = prepare_peft_model(model, peft_config, args)  # noqa: F821

    class Never:
        def __init__(self, model):
            pass

    fake = type("M", (), {"GRPOTrainer": Calls})
    for helper in qpf.HELPERS:
        monkeypatch.setattr(utils, helper, getattr(utils, helper, lambda *args: None), raising=False)
    monkeypatch.setattr(utils, qpf.NAME, _buggy, raising=False)
    assert qpf.probe(fake).needed is True
    assert qpf.probe(type("M", (), {"GRPOTrainer": Never})).needed is False
    monkeypatch.delattr(utils, "peft_module_casting_to_bf16", raising=False)
    assert qpf.probe(fake).needed is None
    monkeypatch.setattr(utils, qpf.NAME, _fixed, raising=False)
    assert qpf.probe(fake).needed is False
