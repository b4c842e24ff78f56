"""trl_compat._helpers.zero3, the one ZeRO-3 helper of zero3-unwrap, zero3-hooks-api, reward-model-zero3
and the vLLM sync, on stand-in objects (no DeepSpeed needed; the real thing runs in test_zero3.py,
test_reward_model_zero3.py and test_vllm_sync.py). Runs in every cell."""

import types

from trl_compat._helpers import zero3

NS = types.SimpleNamespace


def accelerator(stage=None, config=None):
    plugin = None if stage is None and config is None else NS(zero_stage=stage, deepspeed_config=config)
    return NS(state=NS(deepspeed_plugin=plugin))


def test_stage_from_the_plugin_and_from_the_config():
    assert zero3.is_zero3(accelerator(stage=3)) is True
    assert zero3.is_zero3(accelerator(stage=2)) is False
    assert zero3.is_zero3(accelerator()) is False
    assert zero3.is_zero3(object()) is False
    trainer = NS(is_deepspeed_enabled=True, accelerator=accelerator(config={"zero_optimization": {"stage": 3}}))
    assert zero3.config_stage(trainer) == 3
    assert zero3.config_stage(NS(is_deepspeed_enabled=False, accelerator=trainer.accelerator)) is None
    assert zero3.config_stage(NS(is_deepspeed_enabled=True, accelerator=accelerator(config={}))) is None


def test_offload_is_what_trl_finds():
    offload = NS(forward_hooks=[1, 2])
    assert zero3.offload(NS(optimizer=NS(parameter_offload=offload))) is offload
    assert zero3.offload(NS(optimizer=offload)) is offload  # an offload without the wrapper attribute
    assert zero3.offload(NS()) is None  # a bare module
    assert zero3.hook_list(NS(optimizer=NS(parameter_offload=offload))) == [1, 2]
    assert zero3.hook_list(NS()) is None


def test_reregister_only_where_the_offload_has_just_the_new_name():
    calls = []

    def engine(*names):
        offload = NS(module="the module", **{n: (lambda module, n=n: calls.append((n, module))) for n in names})
        return NS(optimizer=NS(parameter_offload=offload))

    assert zero3.reregister_hooks(engine(zero3.NEW)) is True
    assert calls == [(zero3.NEW, "the module")]
    assert zero3.reregister_hooks(engine(zero3.OLD, zero3.NEW)) is False  # TRL's own add_hooks works
    assert zero3.reregister_hooks(engine()) is False  # neither: TRL's code decides
    assert zero3.reregister_hooks(NS()) is False
    assert len(calls) == 1


def test_add_hooks_reading():
    def knows(model):
        model.optimizer.parameter_offload._register_deepspeed_module(model)

    def old(model):
        model.optimizer.parameter_offload._register_hooks_recursively(model)

    assert zero3.add_hooks_knows_new_name(knows) is True
    assert zero3.add_hooks_knows_new_name(old) is False


def test_gathering_nothing_partitioned_imports_nothing(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # an import would raise
    with zero3.gathered([None, NS(data=1)]):
        entered = True
    assert entered
