"""trl_compat._helpers.arguments: a call's arguments by name, whatever their position."""

import functools

from trl_compat._helpers.arguments import arguments


def sync(self, module, prefix="", visited=None):
    return module


class Client:
    def _post(self, url, **kwargs):
        return url


def test_positional_and_keyword_calls_bind_the_same_names():
    assert arguments(sync, "trainer", "model") == {"self": "trainer", "module": "model"}
    assert arguments(sync, "trainer", module="model") == {"self": "trainer", "module": "model"}
    # a recursive call passes prefix/visited: they show, defaults are not filled in
    assert arguments(sync, "trainer", "child", "model.") == {"self": "trainer", "module": "child", "prefix": "model."}


def test_a_release_that_moves_a_parameter_is_read_by_name():
    def moved(self, prefix="", *, module):  # a later signature: module keyword-only
        return module

    assert arguments(moved, "trainer", module="model")["module"] == "model"
    assert "module" not in arguments(moved, "trainer", "model.")  # the position now means prefix


def test_bound_methods_and_calls_that_do_not_bind():
    client = Client()
    assert arguments(client._post, "http://x/update", json={}) == {"self": client, "url": "http://x/update", "kwargs": {"json": {}}}
    assert arguments(sync, "a", "b", "c", "d", "e") == {}  # too many: no guess
    assert arguments(len, [1]) in ({}, {"obj": [1]})  # a builtin: its signature where Python has one
    assert arguments(functools.partial(sync, "trainer"), "model") == {"module": "model"}
