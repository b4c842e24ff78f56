"""trl_compat._engine.patcher: the one way a patch changes anything (no trl needed)."""

import functools

from trl_compat import _engine as engine
from trl_compat._engine.patcher import raw_attribute

import pytest


class Descriptors:
    @staticmethod
    def static(x):
        return ("static", x)

    @classmethod
    def klass(cls, x):
        return (cls.__name__, x)


class DescriptorsChild(Descriptors):
    pass


def _prefixing(original):
    def wrapper(*args, **kwargs):
        return ("wrapped",) + original(*args, **kwargs)

    return wrapper


def test_wrap_keeps_staticmethod_and_classmethod_binding():
    patcher = engine.Patcher("test-wrap")
    patcher.wrap(DescriptorsChild, "static", _prefixing)
    patcher.wrap(DescriptorsChild, "klass", _prefixing)
    try:
        assert DescriptorsChild.static(1) == ("wrapped", "static", 1)
        assert DescriptorsChild().static(2) == ("wrapped", "static", 2)
        assert DescriptorsChild.klass(3) == ("wrapped", "DescriptorsChild", 3)
        assert Descriptors.static(4) == ("static", 4)  # the base class is untouched
        assert patcher.changed() == [f"{__name__}.DescriptorsChild.static", f"{__name__}.DescriptorsChild.klass"]
    finally:
        patcher.undo()
    assert "static" not in vars(DescriptorsChild) and "klass" not in vars(DescriptorsChild)


def test_a_second_copy_of_the_same_patch_is_refused_even_under_another_patch():
    """Two copies of trl_compat (vendored + installed) must not wrap twice: the marker
    travels with the wrappers stacked on top (functools.wraps copies it)."""
    first, upper, second = engine.Patcher("test-lower"), engine.Patcher("test-upper"), engine.Patcher("test-lower")
    first.wrap(DescriptorsChild, "static", _prefixing)

    def wraps_factory(original):
        return functools.wraps(original)(lambda *a, **k: original(*a, **k))

    upper.wrap(DescriptorsChild, "static", wraps_factory)
    try:
        assert engine.markers(vars(DescriptorsChild)["static"]) == {"test-lower", "test-upper"}
        with pytest.raises(engine.AlreadyPatched):
            second.wrap(DescriptorsChild, "static", _prefixing)
        assert DescriptorsChild.static(1) == ("wrapped", "static", 1)  # wrapped once
    finally:
        upper.undo()
        first.undo()


def test_raw_attribute_finds_the_descriptor_along_the_mro():
    assert isinstance(raw_attribute(DescriptorsChild, "static"), staticmethod)
    assert isinstance(raw_attribute(DescriptorsChild, "klass"), classmethod)
    with pytest.raises(AttributeError, match="nowhere"):
        raw_attribute(DescriptorsChild, "nowhere")


def test_undo_leaves_a_value_someone_set_after_us(caplog):
    patcher = engine.Patcher("test-late-setter")
    patcher.wrap(DescriptorsChild, "static", _prefixing)
    theirs = staticmethod(lambda x: ("theirs", x))
    DescriptorsChild.static = theirs
    try:
        patcher.undo()
        assert vars(DescriptorsChild)["static"] is theirs
        assert "was replaced after test-late-setter patched it" in caplog.text
    finally:
        del DescriptorsChild.static


def test_instance_overrides_hold_for_the_block_and_put_back_exactly():
    from trl_compat._engine import instance_overrides

    class Module:
        def state_dict(self):
            return "class"

    module = Module()
    module.named_parameters = "own"  # an instance attribute already there comes back
    with instance_overrides(module, state_dict=lambda: "block", named_parameters="block"):
        assert module.state_dict() == "block" and module.named_parameters == "block"
    assert module.state_dict() == "class" and "state_dict" not in vars(module)  # deleted, not set to the class's
    assert module.named_parameters == "own"
    try:
        with instance_overrides(module, state_dict=lambda: "block"):
            raise KeyError("the wrapped call raised")
    except KeyError:
        pass
    assert "state_dict" not in vars(module)
