"""What the tests of the advice-only entries share (vllm-disabled-tqdm,
vllm-tokenizer-transformers5, peft-transformers5-hybrid-cache): their gate and probe on given
installed versions, and a whole install -> import -> status round on a stand-in trigger module,
so that what a user sees ("undecided" with the upgrade, or a strict run stopping with it) is
checked without the broken stack (which no cell installs)."""

import importlib
import sys
import uuid

import trl_compat
from trl_compat import _engine
from trl_compat._engine import versions as engine_versions
from trl_compat.patches import _advice, declared

# trl.import_utils as far as the entries' must_exist goes
TRIGGER_SRC = "def is_vllm_available():\n    return True\n\nclass _LazyModule:\n    pass\n"


def fake_versions(monkeypatch, versions):
    """The gate (and the probes' messages) read ``versions`` as the installed distributions."""
    monkeypatch.setattr(engine_versions, "dist_version", lambda dist: versions.get(dist))
    # a distribution given as None is not installed, even where the cell has it importable (the stand-in)
    monkeypatch.setattr(engine_versions, "_importable_without_metadata", lambda dist: False)
    # nor is the installed TRL's own code read for its vLLM shims: the given versions are the stack
    # (shim_modules() points the probes at TRL code written by a test)
    monkeypatch.setattr(_advice, "TRL_SHIM_MODULES", ())


def shim_modules(monkeypatch, tmp_path, source):
    """The advice probes read ``source`` as TRL's compatibility code (trl/_compat.py)."""
    name = "tcshim_" + uuid.uuid4().hex[:8]
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(_advice, "TRL_SHIM_MODULES", (name,))


def in_window(monkeypatch, patch_id, versions):
    """``(inside?, reason)`` of the entry's gate on ``versions``."""
    fake_versions(monkeypatch, versions)
    status, reason, _ = _engine.gate(declared(patch_id))
    return status is None, reason


def probe(monkeypatch, patch_id, versions):
    """The entry's verdict on ``versions`` (its probe reads the real transformers where it looks)."""
    fake_versions(monkeypatch, versions)
    patch = declared(patch_id)
    return patch.probe(sys.modules.get(patch.trigger))


def run_through_engine(monkeypatch, tmp_path, patch_id, versions, strict=False):
    """Install a copy of the entry on a stand-in trigger module with ``versions`` installed,
    import that module, and return ``(status, reason)``; under ``strict`` the import raises."""
    name = "tcadvice_" + uuid.uuid4().hex[:8]
    (tmp_path / f"{name}.py").write_text(TRIGGER_SRC)
    monkeypatch.syspath_prepend(str(tmp_path))
    fake_versions(monkeypatch, versions)
    monkeypatch.delenv("TRL_COMPAT_DISABLE", raising=False)
    if strict:
        monkeypatch.setenv("TRL_COMPAT_STRICT", "1")
    else:
        monkeypatch.delenv("TRL_COMPAT_STRICT", raising=False)
    patch = declared(patch_id).replace(id=f"test-{patch_id}", trigger=name)
    _engine.register(patch)
    try:
        trl_compat.install(patch.id)
        importlib.import_module(name)
        return trl_compat.status(patch.id), {r.id: r for r in trl_compat.report()}[patch.id].reason
    finally:
        _engine.unregister(patch.id)
        sys.modules.pop(name, None)
