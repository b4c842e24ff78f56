"""Fixtures of the engine's tests: a fresh synthetic package to patch, test patches that are
forgotten after each test, and one run of ``python -m trl_compat --json`` shared by the tests
that compare a fresh process's statuses (starting Python with TRL costs seconds per cell)."""

import json
import os
import subprocess
import sys
import textwrap
import uuid

from trl_compat import _engine as engine
from trl_compat._engine import Patch, needed

import pytest

TRAINER_SRC = """
class Base:
    def step(self, x):
        return ("base", x)

class Trainer(Base):
    def other(self):
        return "other"
"""


@pytest.fixture
def fake_pkg(tmp_path, monkeypatch):
    """A fresh, not yet imported package ``<name>.trainer`` with an inherited method."""
    name = "tcfake_" + uuid.uuid4().hex[:8]
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text(TRAINER_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name + ".trainer"
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


@pytest.fixture
def calls():
    """What ``wrap_step``'s wrapper was called with."""
    return []


@pytest.fixture
def wrap_step(calls):
    def apply(module, patcher):
        original = module.Trainer.step

        def step(self, *args, **kwargs):
            calls.append(args)
            return ("patched",) + original(self, *args, **kwargs)[1:]

        patcher.replace(module.Trainer, "step", step)

    return apply


@pytest.fixture
def make_patch(wrap_step):
    """``make_patch(module, ...)``: register a test patch (by default: wrap_step, bug found,
    declaring that it changes ``target``)."""

    def make(module, pid=None, probe=lambda m: needed("bug found"), apply=None, target="Trainer.step", requires=None, changes=None):
        patch = Patch(
            id=pid or "test-" + uuid.uuid4().hex[:6],
            summary="test patch",
            upstream="none",
            trigger=module,
            must_exist=target,
            requires=requires or {},
            probe=probe,
            apply=apply or wrap_step,
            changes=changes or (target,),
        )
        engine.register(patch)
        return patch

    return make


@pytest.fixture(autouse=True)
def forget_test_patches(monkeypatch):
    monkeypatch.delenv("TRL_COMPAT_STRICT", raising=False)
    monkeypatch.delenv("TRL_COMPAT_DISABLE", raising=False)
    yield
    for patch in engine.registry():
        if patch.id.startswith("test-"):
            engine.unregister(patch.id)


def _run_py(code, **env):
    """Run ``code`` in a fresh Python (not strict, nothing disabled, as the tests here run) and
    return its stdout."""
    base = {k: v for k, v in os.environ.items() if k not in ("TRL_COMPAT_STRICT", "TRL_COMPAT_DISABLE")}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=dict(base, **env), timeout=600
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture
def run_py():
    return _run_py


CLI = """
    import runpy
    from trl_compat.__main__ import main
    main(["--json"])
    print("-- table --")
    runpy.run_module("trl_compat", run_name="__main__")
"""


@pytest.fixture(scope="session")
def fresh_cli():
    """``(data, table)``: ``python -m trl_compat --json`` and the table, from one fresh process
    (trl_compat imported first; the CLI then imports every pending patch's trigger module)."""
    out = _run_py(CLI)
    data, _, table = out.partition("-- table --\n")
    return json.loads(data), table
