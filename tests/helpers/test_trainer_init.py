"""``around_init``: the hooks see the call's arguments by name, however they were passed, and
TRL's ``__init__`` gets the call untouched (no trl needed: a stand-in trainer module)."""

import types

from trl_compat._engine.patcher import Patcher
from trl_compat._helpers.trainer_init import around_init

import pytest


def trainer_module():
    class GRPOTrainer:
        def __init__(self, model, reward_funcs, args=None, train_dataset=None, **kwargs):
            self.calls = getattr(self, "calls", []) + [("init", model, reward_funcs, args, train_dataset, kwargs)]

    return types.ModuleType("fake_grpo_trainer"), GRPOTrainer


@pytest.fixture
def patched():
    module, cls = trainer_module()
    module.GRPOTrainer = cls
    seen = []

    def before(trainer, arguments):
        trainer.calls = [("before", dict(arguments))]
        seen.append(("before", arguments.get("args")))

    def after(trainer, arguments):
        seen.append(("after", arguments.get("args"), trainer.calls[-1][0]))

    patcher = Patcher("test-around-init")
    around_init(before=before, after=after)(module, patcher)
    yield cls, seen
    patcher.undo()
    assert "__init__" in vars(cls) and not hasattr(cls.__init__, "__wrapped__")


@pytest.mark.parametrize(
    "call",
    [
        lambda cls, config: cls("m", ["r"], config),
        lambda cls, config: cls("m", ["r"], args=config),
        lambda cls, config: cls(model="m", reward_funcs=["r"], args=config),
    ],
)
def test_hooks_get_the_arguments_by_name(patched, call):
    cls, seen = patched
    config = object()
    trainer = call(cls, config)
    assert seen == [("before", config), ("after", config, "init")]
    assert trainer.calls[0][1]["args"] is config and trainer.calls[0][1]["model"] == "m"
    assert trainer.calls[1] == ("init", "m", ["r"], config, None, {})


def test_a_call_that_does_not_bind_reaches_trl_as_it_is(patched):
    cls, seen = patched
    with pytest.raises(TypeError, match="multiple values for argument 'model'"):
        cls("m", model="again")
    assert seen == [("before", None)]


def test_complete_binding_gives_no_arguments_when_one_is_missing():
    module, cls = trainer_module()
    module.GRPOTrainer = cls
    got = []
    patcher = Patcher("test-around-init")
    around_init(before=lambda trainer, arguments: got.append(arguments), complete=True)(module, patcher)
    try:
        with pytest.raises(TypeError):
            cls("m")
        cls("m", ["r"], args="config")
    finally:
        patcher.undo()
    assert got[0] == {}
    assert got[1]["args"] == "config"


def test_during_wraps_trls_call_and_ends_when_it_raises():
    import contextlib

    module, cls = trainer_module()
    module.GRPOTrainer = cls
    log = []

    @contextlib.contextmanager
    def during(trainer, arguments):
        log.append(("enter", arguments.get("args"), hasattr(trainer, "calls")))
        try:
            yield
        finally:
            log.append(("exit", getattr(trainer, "calls", [("none",)])[-1][0]))

    patcher = Patcher("test-around-init")
    around_init(during=during)(module, patcher)
    try:
        cls("m", ["r"], args="config")
        with pytest.raises(TypeError):
            cls("m", model="again")
    finally:
        patcher.undo()
    assert log == [("enter", "config", False), ("exit", "init"), ("enter", None, False), ("exit", "none")]
