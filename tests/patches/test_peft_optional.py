"""peft-optional: GRPO on a machine without peft.

Two halves:

* Synthetic modules (every cell, trl or not): a temp package that reproduces the pattern of TRL
  PR #2725 (a method that uses a ``PeftModel`` global bound only ``if is_peft_available()``) and of
  0.14/0.15's ``__init__`` (``get_peft_model``). The real PATCH's probe and apply run on it through
  the engine, with "peft is not importable" forced, so the bug and the fix are shown everywhere.
* Real TRL (the ``trl0.15.2-tf4.48.3-nopeft`` cell; skipped where peft is installed or TRL is
  outside the window): 3-step full fine-tuning GRPO runs with and without the vLLM stand-in, the
  early ImportError for ``peft_config``, and the PR #2725 line put back into the installed
  ``grpo_trainer.py`` source to show the NameError and its fix on TRL's real training loop.
"""

import importlib
import importlib.util
import inspect
import re
import sys
import types
import uuid

import trl_compat
from trl_compat import _engine as engine
from trl_compat._engine import Patch, Patcher, dist_version
from trl_compat.patches import declared, peft_optional

import pytest

PATCH = declared("peft-optional")
PID = PATCH.id

DECO_SRC = """
import functools

def profiling_decorator(fn):  # like trl.extras.profiling: a decorator from another module
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)
    return wrapper
"""

# The shape of trl/trainer/grpo_trainer.py at commit 81221661c (PR #2725), without peft.
TRAINER_SRC = """
from .deco import profiling_decorator

_PEFT = False  # what transformers' is_peft_available() said when the module was imported
if _PEFT:
    from peft import PeftConfig, PeftModel, get_peft_model

WORK = []


def is_peft_available():
    return _PEFT


class GRPOTrainer:
    def __init__(self, model, reward_funcs=None, args=None, peft_config: "PeftConfig" = None):
        WORK.append("model loaded")  # stands for from_pretrained: the work an early error saves
        if peft_config is not None:
            model = get_peft_model(model, peft_config)
        self.model = model

    @profiling_decorator
    def _move_model_to_vllm(self):
        unwrapped_model = self.model
        if hasattr(unwrapped_model, "_orig_mod"):
            return "compiled"
        elif isinstance(unwrapped_model, PeftModel):
            return "peft"
        else:
            return "full"

    def compute_loss(self):
        def is_adapter(model):  # nested code object, like 0.14.0's get_per_token_logps
            return isinstance(model, PeftModel)
        return is_adapter(self.model)

    def guarded(self):  # PR #2850's fix: not the bug
        return is_peft_available() and isinstance(self.model, PeftModel)
"""

GUARDED_SRC = """
def is_peft_available():
    return False

class GRPOTrainer:
    def __init__(self, model, peft_config=None):
        if peft_config is not None:
            if not is_peft_available():
                raise ImportError("PEFT is required to use `peft_config`. Run `pip install peft`.")
            model = get_peft_model(model, peft_config)
        self.model = model
"""

DEFINED_SRC = """
class PeftModel:  # as if "from peft import PeftModel" had run
    pass

def get_peft_model(model, config):
    return model

class GRPOTrainer:
    def __init__(self, model, peft_config=None):
        self.model = get_peft_model(model, peft_config) if peft_config is not None else model

    def _move_model_to_vllm(self):
        return isinstance(self.model, PeftModel)
"""


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.delenv("TRL_COMPAT_DISABLE", raising=False)
    yield
    for patch in engine.registry():
        if patch.id.startswith("test-peft-optional"):
            engine.unregister(patch.id)


@pytest.fixture
def make_pkg(tmp_path, monkeypatch):
    """``make_pkg(src)`` -> name of a fresh, not yet imported ``<pkg>.grpo_trainer``."""
    made = []

    def make(src):
        name = "tcpeft_" + uuid.uuid4().hex[:8]
        pkg = tmp_path / name
        pkg.mkdir()
        (pkg / "__init__.py").write_text("")
        (pkg / "deco.py").write_text(DECO_SRC)
        (pkg / "grpo_trainer.py").write_text(src)
        made.append(name)
        return name + ".grpo_trainer"

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for name in made:
        for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[mod]


@pytest.fixture
def no_peft(monkeypatch):
    """Make the probe see peft as not importable, as in the nopeft cell (peft is never imported)."""
    monkeypatch.setattr(peft_optional, "_peft_importable", lambda: False)


def register_on(module_name):
    """The real PATCH's gate-free twin, pointed at another module."""
    patch = Patch(
        id="test-peft-optional-" + uuid.uuid4().hex[:6],
        summary=PATCH.summary,
        upstream=PATCH.upstream,
        trigger=module_name,
        must_exist=PATCH.must_exist,
        changes=PATCH.changes,
        requires={},
        probe=PATCH.probe,
        apply=PATCH.apply,
    )
    engine.register(patch)
    return patch


# -- synthetic modules: every cell -------------------------------------------------------------


def test_synthetic_pattern_raises_name_error_without_the_patch(make_pkg):
    mod = importlib.import_module(make_pkg(TRAINER_SRC))
    trainer = mod.GRPOTrainer(model=object())
    with pytest.raises(NameError, match=r"^name 'PeftModel' is not defined$"):
        trainer._move_model_to_vllm()
    with pytest.raises(NameError, match=r"^name 'PeftModel' is not defined$"):
        trainer.compute_loss()
    mod.WORK.clear()
    with pytest.raises(NameError, match=r"^name 'get_peft_model' is not defined$"):
        mod.GRPOTrainer(model=object(), peft_config=object())
    assert mod.WORK == ["model loaded"]  # TRL's own failure comes after the expensive work


def test_probe_finds_every_unguarded_use(make_pkg, no_peft):
    mod = importlib.import_module(make_pkg(TRAINER_SRC))
    unguarded, guarded = peft_optional.scan(mod)
    assert unguarded == {
        "get_peft_model": ["GRPOTrainer.__init__"],
        # through the decorator's __wrapped__, and into the nested function's code object
        "PeftModel": ["GRPOTrainer._move_model_to_vllm", "GRPOTrainer.compute_loss"],
    }
    assert guarded == {"PeftModel": ["GRPOTrainer.guarded"]}
    verdict = PATCH.probe(mod)
    assert verdict.needed is True
    assert "PeftModel in GRPOTrainer._move_model_to_vllm, GRPOTrainer.compute_loss" in verdict.reason
    assert "get_peft_model in GRPOTrainer.__init__" in verdict.reason


def test_fix_on_the_synthetic_pattern(make_pkg, no_peft):
    name = make_pkg(TRAINER_SRC)
    patch = register_on(name)
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.PENDING
    mod = importlib.import_module(name)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED, trl_compat.report()

    trainer = mod.GRPOTrainer(model=object())
    assert trainer._move_model_to_vllm() == "full"  # "is this a PeftModel?" is simply no
    assert trainer.compute_loss() is False
    assert trainer.guarded() is False
    assert not isinstance(object(), mod.PeftModel)

    mod.WORK.clear()
    with pytest.raises(ImportError) as info:
        mod.GRPOTrainer(object(), peft_config=object())  # positional model, keyword peft_config
    assert mod.WORK == []  # raised before any work
    assert info.value.name == "peft"
    assert "pip install peft" in str(info.value) and "of your transformers' day" in str(info.value)
    with pytest.raises(ImportError, match="pip install peft"):
        mod.GRPOTrainer(object(), None, None, object())  # peft_config passed positionally
    with pytest.raises(ImportError, match="pip install peft"):
        mod.get_peft_model(object(), object())  # any other caller gets the clear message too
    with pytest.raises(ImportError, match="pip install peft"):
        mod.PeftModel.from_pretrained
    assert mod.WORK == []
    assert list(inspect.signature(mod.GRPOTrainer.__init__).parameters) == ["self", "model", "reward_funcs", "args", "peft_config"]
    # Once bound, the probe finds nothing left to fix (no double application).
    assert PATCH.probe(mod).needed is False

    trl_compat.revert(patch.id)  # the fix is exactly what changes the outcome
    assert "PeftModel" not in vars(mod) and "get_peft_model" not in vars(mod)
    with pytest.raises(NameError, match="PeftModel"):
        trainer._move_model_to_vllm()
    mod.WORK.clear()
    with pytest.raises(NameError, match="get_peft_model"):
        mod.GRPOTrainer(object(), peft_config=object())
    assert mod.WORK == ["model loaded"]


def test_apply_rolls_back_when_it_fails(make_pkg, no_peft, monkeypatch):
    mod = importlib.import_module(make_pkg(TRAINER_SRC))
    original_init = mod.GRPOTrainer.__init__

    def broken(**_hooks):  # the __init__ wrapper fails after the names were bound
        def apply(module, patcher):
            raise RuntimeError("boom")

        return apply

    monkeypatch.setattr(peft_optional, "around_init", broken)
    patcher = Patcher("test-peft-optional-rollback")
    with pytest.raises(RuntimeError):
        PATCH.apply(mod, patcher)
    patcher.undo()  # what the engine does on failure
    assert "PeftModel" not in vars(mod) and "get_peft_model" not in vars(mod)
    assert mod.GRPOTrainer.__init__ is original_init


def test_probe_guarded_module_is_not_needed(make_pkg, no_peft):
    mod = importlib.import_module(make_pkg(GUARDED_SRC))
    verdict = PATCH.probe(mod)
    assert verdict.needed is False
    assert "guarded by is_peft_available()" in verdict.reason


def test_probe_with_peft_present(make_pkg, monkeypatch):
    monkeypatch.setattr(peft_optional, "_peft_importable", lambda: True)
    defined = importlib.import_module(make_pkg(DEFINED_SRC))
    verdict = PATCH.probe(defined)
    assert verdict == (False, "peft is installed: the module defines the PEFT names it uses")
    # Names undefined although peft is importable: trl_compat will not hide real PEFT models.
    buggy = importlib.import_module(make_pkg(TRAINER_SRC))
    assert PATCH.probe(buggy).needed is None


def test_peft_importable_does_not_import_peft():
    had_peft = "peft" in sys.modules
    try:
        expected = importlib.util.find_spec("peft") is not None
    except ValueError:
        expected = True
    assert peft_optional._peft_importable() is expected
    assert ("peft" in sys.modules) is had_peft


# -- real TRL ----------------------------------------------------------------------------------


def _in_window():
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    raw = dist_version("trl")
    return raw is not None and SpecifierSet(PATCH.requires["trl"], prereleases=True).contains(Version(raw))


def _peft_missing():
    return importlib.util.find_spec("peft") is None


needs_nopeft_cell = pytest.mark.skipif(
    not (_in_window() and _peft_missing()),
    reason="needs TRL <=0.16.0.dev0 without peft installed (cell trl0.15.2-tf4.48.3-nopeft)",
)


def test_cli_report(capsys):
    import json

    from trl_compat.__main__ import main

    assert main(["--json"]) == 0  # what `python -m trl_compat --json` prints
    row = {r["id"]: r for r in json.loads(capsys.readouterr().out)["patches"]}[PID]
    if dist_version("trl") is None:
        assert (row["status"], row["reason"]) == (trl_compat.NOT_NEEDED, "trl is not installed")
    elif _in_window() and _peft_missing():
        assert row["status"] == trl_compat.APPLIED
    else:
        assert row["status"] == trl_compat.NOT_NEEDED


@needs_nopeft_cell
def test_full_finetuning_three_steps(tmp_path):
    import trl.trainer.grpo_trainer as grpo

    import grpo_run

    assert trl_compat.status(PID) == trl_compat.APPLIED
    assert grpo.get_peft_model is peft_optional.get_peft_model_unavailable
    trainer, history = grpo_run.run_grpo(tmp_path, model="qwen2", steps=3)
    assert trainer.state.global_step == 3
    assert grpo_run.finite_losses(history) and grpo_run.changed_trainable(trainer)


@needs_nopeft_cell
def test_full_finetuning_with_vllm_three_steps(tmp_path):
    import grpo_run

    trainer, history = grpo_run.run_grpo(tmp_path, model="qwen2", steps=3, use_vllm=True)  # skips without stand-in
    assert trainer.state.global_step == 3
    assert grpo_run.finite_losses(history) and grpo_run.changed_trainable(trainer)
    received = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model.received_names
    assert received and all(sorted(names) == sorted(trainer.model.state_dict()) for names in received)


@needs_nopeft_cell
def test_peft_config_raises_clear_import_error_before_loading(tmp_path, monkeypatch, unpatched):
    import trl.trainer.grpo_trainer as grpo

    import grpo_run
    import tiny

    path = tiny.save_tiny(tmp_path / "tiny")
    loads = []
    original = grpo.AutoModelForCausalLM.from_pretrained.__func__

    def recording(cls, *args, **kwargs):
        loads.append(args[0] if args else kwargs.get("pretrained_model_name_or_path"))
        return original(cls, *args, **kwargs)

    monkeypatch.setattr(grpo.AutoModelForCausalLM, "from_pretrained", classmethod(recording))
    lora = types.SimpleNamespace(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])  # LoraConfig stand-in

    with unpatched(PID):
        with pytest.raises(NameError, match=r"^name 'get_peft_model' is not defined$"):
            grpo_run.make_trainer(tmp_path, model=path, peft_config=lora)
        assert loads == [path]  # TRL loaded the model before failing
    loads.clear()
    with pytest.raises(ImportError) as info:
        grpo_run.make_trainer(tmp_path, model=path, peft_config=lora)
    assert loads == []  # nothing loaded: the error comes first
    assert info.value.name == "peft"
    message = str(info.value)
    assert message.startswith("GRPOTrainer(peft_config=...) needs PEFT, which is not installed.")
    assert "`pip install peft`" in message and "of your transformers' day" in message


BUGGY_LINE = "isinstance(unwrapped_model, PeftModel)"


def _load_pr2725_variant(grpo, tmp_path):
    """The installed grpo_trainer.py with PR #2725's check put back, as a sibling module of TRL."""
    if "_move_model_to_vllm" not in vars(grpo.GRPOTrainer):  # 0.14.0 syncs inline in compute_loss
        pytest.skip("this TRL has no GRPOTrainer._move_model_to_vllm")
    source = inspect.getsource(grpo)
    method = inspect.getsource(grpo.GRPOTrainer._move_model_to_vllm)
    if "is_peft_model(unwrapped_model)" not in method or "self.llm" not in method:
        pytest.skip("this TRL has no colocated _move_model_to_vllm with an is_peft_model check")
    buggy_method = method.replace("is_peft_model(unwrapped_model)", BUGGY_LINE)
    source = source.replace(method, buggy_method)
    source = re.sub(r"from peft import PeftConfig, get_peft_model", "from peft import PeftConfig, PeftModel, get_peft_model", source)
    assert BUGGY_LINE in source and "PeftModel, get_peft_model" in source
    name = "trl.trainer._tc_grpo_pr2725_" + uuid.uuid4().hex[:6]
    path = tmp_path / "grpo_trainer_pr2725.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return name, module


@needs_nopeft_cell
def test_pr2725_line_on_the_real_trainer(tmp_path):
    import trl.trainer.grpo_trainer as grpo

    import grpo_run

    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    name, buggy = _load_pr2725_variant(grpo, tmp_path)
    try:
        # Without the patch: full fine-tuning with vLLM dies on the first weight sync, which
        # 0.15.x does once the first step is done (_last_loaded_step starts at 0).
        trainer = grpo_run.make_trainer(tmp_path, model="qwen2", use_vllm=True, trainer_cls=buggy.GRPOTrainer)
        with pytest.raises(NameError, match=r"^name 'PeftModel' is not defined$"):
            trainer.train()
        assert trainer.state.global_step == 1

        patch = register_on(name)  # the real probe decides on the real (altered) TRL code
        trl_compat.install(patch.id)
        assert trl_compat.status(patch.id) == trl_compat.APPLIED, trl_compat.report()
        reason = {r.id: r for r in trl_compat.report()}[patch.id].reason
        assert "PeftModel in GRPOTrainer._move_model_to_vllm" in reason
        assert buggy.PeftModel is peft_optional.PeftModelUnavailable

        # The altered copy of TRL's module carries none of the other patches (they act on the real
        # module): its stale prefix cache (vllm-prefix-cache's bug) is rightly caught by the
        # off-policy guard (TRL_COMPAT_GUARD=strict in the matrix), which only observes here.
        from trl_compat import guard

        with guard.observing():
            trainer, history = grpo_run.run_grpo(tmp_path, model="qwen2", use_vllm=True, trainer_cls=buggy.GRPOTrainer)
        assert trainer.state.global_step == 3
        assert grpo_run.finite_losses(history) and grpo_run.changed_trainable(trainer)
        model = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model
        # the full model's plain names, as on the non-PEFT branch
        assert model.received_names and sorted(model.received_names[-1]) == sorted(trainer.model.state_dict())
    finally:
        sys.modules.pop(name, None)
