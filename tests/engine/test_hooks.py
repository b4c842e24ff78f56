"""trl_compat._engine.hooks: a hook runs once its module is imported, at once if it already
is, whatever the import order; and ``import trl_compat`` stays light."""

import importlib
import importlib.util
import inspect
import json
import sys
import uuid

import trl_compat
from trl_compat._engine import hooks
from trl_compat.patches import PATCHES

import pytest

from cells import engine_cells


@pytest.fixture
def fresh_module(tmp_path, monkeypatch):
    name = "tchook_" + uuid.uuid4().hex[:8]
    (tmp_path / f"{name}.py").write_text("def f():\n    return 'f'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    hooks._hooks.pop(name, None)


def test_a_hook_fires_once_its_module_is_imported(fresh_module):
    seen = []
    hooks.when_imported(fresh_module, seen.append)
    hooks.when_imported(fresh_module, lambda m: seen.append(m.f()))
    assert seen == []
    module = importlib.import_module(fresh_module)
    assert seen == [module, "f"]
    importlib.import_module(fresh_module)  # once only
    assert seen == [module, "f"]


def test_a_hook_fires_at_once_on_an_imported_module(fresh_module):
    module = importlib.import_module(fresh_module)
    seen = []
    hooks.when_imported(fresh_module, seen.append)
    assert seen == [module]


def test_the_module_keeps_its_own_loader(fresh_module):
    """Probes read source through the module's loader: ours must not stay in its place."""
    hooks.when_imported(fresh_module, lambda m: None)
    module = importlib.import_module(fresh_module)
    assert type(module.__loader__) is not hooks._Loader
    assert type(module.__spec__.loader) is not hooks._Loader
    assert "return 'f'" in inspect.getsource(module.f)


def test_a_spec_found_before_the_import_looks_like_its_loader(fresh_module):
    """importlib.util.find_spec() of a watched module gives our loader (as wrapt's did): it
    passes for the real one in isinstance checks."""
    from importlib.machinery import SourceFileLoader

    hooks.when_imported(fresh_module, lambda m: None)
    spec = importlib.util.find_spec(fresh_module)
    assert type(spec.loader) is hooks._Loader and isinstance(spec.loader, SourceFileLoader)
    assert "return 'f'" in spec.loader.get_source(fresh_module)


def test_a_failed_import_keeps_the_hook_for_the_next_try(fresh_module, tmp_path):
    (tmp_path / f"{fresh_module}.py").write_text("raise ImportError('not yet')\n")
    importlib.invalidate_caches()
    seen = []
    hooks.when_imported(fresh_module, seen.append)
    with pytest.raises(ImportError, match="not yet"):
        importlib.import_module(fresh_module)
    assert seen == []
    (tmp_path / f"{fresh_module}.py").write_text("x = 1\n")
    sys.modules.pop(fresh_module, None)
    importlib.invalidate_caches()
    module = importlib.import_module(fresh_module)
    assert seen == [module]


def test_import_is_light(run_py):
    """No TRL stack, and none of what made it cost 10x a bare start-up (wrapt's asyncio/ssl,
    importlib.metadata, packaging): the gate reads metadata files and compares versions itself."""
    out = run_py("""
        import sys, trl_compat
        heavy = ("torch", "transformers", "trl", "peft", "deepspeed", "vllm", "wrapt", "asyncio", "ssl",
                 "importlib.metadata", "packaging", "packaging.version", "email")
        print([m for m in heavy if m in sys.modules])
    """)
    assert out.strip() == "[]"


# Every trigger module the CLI imports (trl.scripts.vllm_serve, vllm.utils, ... where installed), as it
# does; the names are written into the child's code, which must not import trl_compat before them.
IMPORT_TRIGGERS = (
    "import importlib\n"
    f"for _name in {list(dict.fromkeys(p.trigger for p in PATCHES))!r}:\n"
    "    try:\n"
    "        importlib.import_module(_name)\n"
    "    except Exception:\n"
    "        pass\n"
)
ORDERS = {
    "trl first": "from trl import GRPOTrainer\n" + IMPORT_TRIGGERS + "import trl_compat",
    # On transformers 5, or with vLLM >= 0.12, the GRPO module cannot import before the fix (that is
    # the bug): trl first, then trl_compat, then the GRPO modules.
    "trl first, GRPO after the fix": "import trl, trl.import_utils\nimport trl_compat\nfrom trl import GRPOTrainer\n"
    + IMPORT_TRIGGERS,
}


@engine_cells
def test_import_order_does_not_matter_on_real_trl(fresh_cli, run_py):
    """trl_compat first (the CLI's process: it imports every trigger module after trl_compat)
    and trl first end with the same statuses."""
    pytest.importorskip("trl")
    import_fixes = ("transformers5-import", "vllm-guided-decoding-import")
    grpo_after = any(trl_compat.status(pid) == trl_compat.APPLIED for pid in import_fixes)
    order = "trl first, GRPO after the fix" if grpo_after else "trl first"
    out = run_py(ORDERS[order] + "\nimport json\nprint(json.dumps([(r.id, r.status) for r in trl_compat.report()]))")
    trl_first = [tuple(pair) for pair in json.loads(out.strip().splitlines()[-1])]
    compat_first = [(r["id"], r["status"]) for r in fresh_cli[0]["patches"]]
    assert trl_first == compat_first
    assert all(status != trl_compat.PENDING for _, status in trl_first)


def test_a_module_still_executing_in_another_thread_is_patched_once_it_is_done(tmp_path, monkeypatch, make_patch):
    """install() while another thread is half-way through the trigger module: the hook fires at
    once (the module is in sys.modules), waits for that import, then probes the whole module."""
    import threading
    import types

    name = "tcslow_" + uuid.uuid4().hex[:8]
    signals = types.ModuleType(name + "_signals")
    signals.started, signals.go = threading.Event(), threading.Event()
    monkeypatch.setitem(sys.modules, signals.__name__, signals)
    (tmp_path / f"{name}.py").write_text(
        f"import {signals.__name__} as signals\n"
        "class Trainer:\n    def step(self, x):\n        return ('base', x)\n"
        "signals.started.set()\nsignals.go.wait(60)\n"
        "DONE = True\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def probe(module):
        seen.append(getattr(module, "DONE", False))
        return trl_compat._engine.needed("bug found")

    patch = make_patch(name, probe=probe)
    importer = threading.Thread(target=importlib.import_module, args=(name,))
    installer = threading.Thread(target=trl_compat.install, args=(patch.id,))
    real_import = importlib.import_module

    def import_module(module_name, *args):
        if module_name == name:
            signals.go.set()  # the hook is about to wait for the importing thread: let it finish
        return real_import(module_name, *args)

    try:
        importer.start()
        assert signals.started.wait(60)
        monkeypatch.setattr(importlib, "import_module", import_module)
        installer.start()
        importer.join(60)
        installer.join(60)
        assert seen == [True]
        assert trl_compat.status(patch.id) == trl_compat.APPLIED
        assert sys.modules[name].Trainer().step(1) == ("patched", 1)
    finally:
        signals.go.set()
        sys.modules.pop(name, None)
