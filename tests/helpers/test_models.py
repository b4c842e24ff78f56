"""trl_compat._helpers.models.peel: the model under the wrappers training puts around it."""

import pytest

torch = pytest.importorskip("torch")

from trl_compat._helpers.models import peel

import tiny
from cells import engine_cells


def stand_in(name, inner):
    """A wrapper known by class name only (the real ones need a process group); like the real
    DeepSpeedEngine, DDP and FSDP1, it keeps the model as ``.module``."""
    wrapper = type(name, (torch.nn.Module,), {})()
    wrapper.module = inner
    return wrapper


@pytest.fixture(scope="module")
def model():
    return tiny.make_model("qwen2")


@engine_cells  # torch.compile's first call imports dynamo: 5 - 14 s a cell, the same torch in every cell
def test_peels_compile_and_data_parallel(model):
    assert peel(torch.nn.DataParallel(model)) is model
    assert peel(torch.compile(model)) is model  # compiles lazily: nothing is compiled here
    assert peel(torch.compile(torch.nn.DataParallel(model))) is model


@pytest.mark.parametrize("name", ["DeepSpeedEngine", "DistributedDataParallel", "PipelineEngine"])
def test_peels_distributed_wrappers_by_class_name(model, name):
    assert peel(stand_in(name, torch.nn.DataParallel(model))) is model
    subclass = type("My" + name, (type(stand_in(name, model)),), {})()
    subclass.module = model
    assert peel(subclass) is model  # along the MRO


def test_fsdp1_only_when_asked(model):
    fsdp = stand_in("FullyShardedDataParallel", model)
    assert peel(fsdp) is model
    assert peel(fsdp, fsdp=False) is fsdp  # the vLLM sync gathers the shards through the FSDP module


def test_peft_only_when_asked(model):
    peft = pytest.importorskip("peft")
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    try:
        assert peel(wrapped) is model
        assert peel(stand_in("DeepSpeedEngine", wrapped)) is model
        assert peel(wrapped.base_model) is model  # a bare LoraModel
        assert peel(stand_in("DeepSpeedEngine", wrapped), peft=False) is wrapped  # merging needs the PeftModel
    finally:
        wrapped.unload()


def test_a_plain_object_is_returned_as_it_is():
    obj = object()
    assert peel(obj) is obj


def test_is_peft_model_by_class_name_along_the_mro(model):
    from trl_compat._helpers.models import is_peft_model

    assert not is_peft_model(model)
    assert is_peft_model(stand_in("PeftModel", model))
    assert is_peft_model(type("PeftModelForCausalLM", (type(stand_in("PeftModel", model)),), {})())  # a subclass
    assert not is_peft_model(stand_in("LoraModel", model))  # the tuner inside is not the PeftModel
