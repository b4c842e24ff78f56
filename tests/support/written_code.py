"""A module written by a test (``tmp_path / "fake_grpo.py"``), for probes read on code that imitates a
TRL release's: the probes read a class's source through ``inspect``, which finds it by the class's
module, so the module is registered in ``sys.modules`` for the test when ``monkeypatch`` is given."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

NAME = "fake_grpo"


def load(path, monkeypatch=None) -> ModuleType:
    """The module at ``path``, executed as ``fake_grpo``."""
    spec = importlib.util.spec_from_file_location(NAME, path)
    module = importlib.util.module_from_spec(spec)
    if monkeypatch is not None:
        monkeypatch.setitem(sys.modules, NAME, module)
    spec.loader.exec_module(module)
    return module
