"""transformers5-import, transformers5-use-cache and transformers5-warnings-issued: TRL < 0.20 on
transformers 5.

Same file in every cell:

* every cell: the status expected for the installed versions ("applied" for TRL 0.14-0.19 on
  transformers >= 5, "not needed" elsewhere, including without trl);
* TRL 0.20 - 0.27.1 on transformers >= 5.1 (trl0.27.1-tf5.1.0): only transformers5-warnings-issued
  applies: its bug without the patch and the three GRPO runs below with it;
* affected cells (e.g. trl0.19.1-tf5.23.0): each bug reproduced without its patch, with its exact
  error (the import bug in a subprocess, since it happens at ``import``), the flags' values with the
  patch, the import fix when ``import trl`` (and a failed ``from trl import GRPOTrainer``) came
  before ``import trl_compat``, and three real 3-step GRPO runs: full fine-tuning of Qwen2 from a
  path (use_cache=None), LoRA on Llama, and beta > 0 with a reference model loaded by TRL.
"""

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
from packaging.version import Version

from versions import installed

TRL = installed("trl")
TF = installed("transformers")
AFFECTED = TRL is not None and TF is not None and Version("0.14.0.dev0") <= TRL < Version("0.20.0") and TF >= Version("5.0.0.dev0")
# transformers5-warnings-issued alone reaches further: TRL < 0.27.2 on transformers >= 5.1 (5.0.0 has the dict).
WARNINGS_AFFECTED = (
    TRL is not None and TF is not None and Version("0.14.0.dev0") <= TRL < Version("0.27.2") and TF >= Version("5.1.0.dev0")
)
IMPORT_ID, USE_CACHE_ID, WARNINGS_ID = "transformers5-import", "transformers5-use-cache", "transformers5-warnings-issued"
IDS = (IMPORT_ID, USE_CACHE_ID, WARNINGS_ID)

needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"only TRL 0.14-0.19 on transformers 5 (here trl {TRL}, transformers {TF})")
needs_warnings_affected = pytest.mark.skipif(
    not WARNINGS_AFFECTED, reason=f"only TRL 0.14-0.27.1 on transformers >= 5.1 (here trl {TRL}, transformers {TF})"
)


def _run(code, **env):
    """Run ``code`` in a fresh interpreter (imports happen there for the first time)."""
    full_env = dict(os.environ, **env)
    full_env.pop("TRL_COMPAT_DISABLE", None)
    full_env.update(env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full_env, timeout=300)


def _expected_flags():
    """``_x_available`` -> whether ``x`` is importable, for trl.import_utils' tuple-prone flags."""
    import trl.import_utils as iu

    names = [
        n
        for n, v in vars(iu).items()
        if n.startswith("_") and n.endswith("_available") and not callable(v) and n != "_is_liger_kernel_available"
    ]  # unpacked from a (bool, version) pair: a bool already
    return {n: importlib.util.find_spec(n[1 : -len("_available")]) is not None for n in names}


# -- every cell ----------------------------------------------------------------------------------


# -- bug 1, TRL 0.27 - 0.28: the lazy package checks ------------------------------------------------
# TRL 0.27.0 - 0.28.x call transformers' helper inside each is_*_available(); no cell pairs them with a
# transformers >= 5.3 (whose helper answers tuples): the module below has TRL 0.27.1's lines, run against
# the installed transformers' real helper. Every cell with transformers.
TRL_0_27_IMPORT_UTILS = """
from transformers.utils.import_utils import _is_package_available


def is_weave_available() -> bool:
    return _is_package_available("weave")


def is_requests_available() -> bool:
    return _is_package_available("requests")


def is_vllm_available() -> bool:
    _vllm_available, _vllm_version = _is_package_available("vllm", return_version=True)
    return _vllm_available
"""
TF_TUPLES = TF is not None and TF >= Version("5.3.0.dev0")  # transformers 5.3 made the helper answer (exists, version)


@pytest.mark.skipif(TF is None, reason="needs transformers")
def test_lazy_checks_of_trl_0_27(tmp_path):
    from trl_compat._engine import Patcher
    from trl_compat.patches import transformers5_import as patch_module

    path = tmp_path / "trl_0_27_import_utils.py"
    path.write_text(TRL_0_27_IMPORT_UTILS)
    spec = importlib.util.spec_from_file_location("trl_0_27_import_utils", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    weave_installed = importlib.util.find_spec("weave") is not None
    requests_installed = importlib.util.find_spec("requests") is not None
    verdict = patch_module.probe(module)
    assert verdict.needed is TF_TUPLES, verdict
    if not TF_TUPLES:  # transformers < 5.3: bools, nothing to fix
        assert module.is_weave_available() is weave_installed
        return
    assert "answers (exists, version) tuples" in verdict.reason
    assert module.is_weave_available() == (weave_installed, None)  # the bug: (False, None) is truthy
    patcher = Patcher(IMPORT_ID)
    patch_module.apply(module, patcher)
    try:
        assert module.is_weave_available() is weave_installed
        assert module.is_requests_available() is requests_installed
        assert module.is_vllm_available() is (importlib.util.find_spec("vllm") is not None)  # return_version=True: the pair
        assert patch_module.probe(module).needed is False  # the wrapped helper answers bools now
    finally:
        patcher.undo()
    assert module.is_weave_available() == (weave_installed, None)


@needs_affected
def test_package_check_answers_bools_with_patch():
    import trl.import_utils as iu

    if not TF_TUPLES:
        pytest.skip(f"transformers {TF} answers bools")
    assert iu._is_package_available("surely_not_a_package_xyz") is False
    assert iu._is_package_available("trl") is True
    exists, version = iu._is_package_available("trl", return_version=True)
    assert exists is True and Version(version) == TRL


# -- bug 1: the import ---------------------------------------------------------------------------


@needs_affected
def test_import_fails_without_patch():
    missing = "requests" if importlib.util.find_spec("requests") is None else None
    result = _run("import trl_compat\nfrom trl import GRPOTrainer\n", TRL_COMPAT_DISABLE=IMPORT_ID)
    assert result.returncode != 0
    if missing:  # the first guarded import trl 0.19's GRPO path reaches (trl/extras/vllm_client.py)
        assert f"ModuleNotFoundError: No module named '{missing}'" in result.stderr, result.stderr[-3000:]
    else:
        assert "ModuleNotFoundError: No module named" in result.stderr, result.stderr[-3000:]


@needs_affected
def test_import_flags_are_tuples_without_patch(unpatched):
    import trl.import_utils as iu

    expected = _expected_flags()
    with unpatched(IMPORT_ID):
        values = {n: getattr(iu, n) for n in expected}
        assert all(isinstance(v, tuple) for v in values.values()), values
        assert all(bool(v) for v in values.values())  # (False, None) is truthy: the bug
        assert iu.is_vllm_available() == (False, None)
    assert {n: getattr(iu, n) for n in expected} == expected
    assert all(type(getattr(iu, n)) is bool for n in expected)
    assert iu.is_vllm_available() is False and iu.is_requests_available() is (importlib.util.find_spec("requests") is not None)


@needs_affected
def test_import_fixed_when_trl_came_first():
    result = _run("""
        import importlib.util, trl
        try:
            from trl import GRPOTrainer
        except RuntimeError as exc:  # trl's lazy module re-raises the ModuleNotFoundError as its cause
            print("FIRST", type(exc.__cause__).__name__, exc.__cause__)
        import trl_compat
        from trl import GRPOTrainer
        import trl.import_utils as iu
        print("STATUS", *(trl_compat.status(pid) for pid in
                          ("transformers5-import", "transformers5-use-cache", "transformers5-warnings-issued")))
        print("VLLM", repr(iu.is_vllm_available()), "DEEPSPEED", repr(iu.is_deepspeed_available()),
              importlib.util.find_spec("deepspeed") is not None)
    """)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    if importlib.util.find_spec("requests") is None:
        assert lines["FIRST"] == "ModuleNotFoundError No module named 'requests'"
    assert lines["STATUS"] == "applied applied applied"
    vllm, _, deepspeed_flag, deepspeed_found = lines["VLLM"].split(" ")
    assert vllm == "False" and deepspeed_flag == deepspeed_found


# -- bugs 2 and 3: GRPOTrainer.__init__ ------------------------------------------------------------


@needs_affected
def test_use_cache_none_fails_without_patch(tmp_path, unpatched):
    from huggingface_hub.errors import StrictDataclassFieldValidationError

    import grpo_run

    with unpatched(USE_CACHE_ID):
        with pytest.raises(StrictDataclassFieldValidationError) as info:
            grpo_run.make_trainer(tmp_path, model="qwen2")  # a path: TRL loads it with use_cache=None
    assert "Field 'use_cache' expected bool, got NoneType" in str(info.value)


@needs_warnings_affected
def test_warnings_issued_missing_without_patch(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401  the trigger: the patch applies on this import

    import grpo_run
    import tiny

    with unpatched(WARNINGS_ID):
        with pytest.raises(AttributeError) as info:
            grpo_run.make_trainer(tmp_path, model=tiny.make_model("qwen2"))  # an instance: no from_pretrained
    assert str(info.value) == "'Qwen2ForCausalLM' object has no attribute 'warnings_issued'"


@needs_affected
def test_proxy_drops_only_none_use_cache(tmp_path):
    from trl_compat.patches.transformers5_use_cache import DropNoneUseCache

    import transformers
    import trl.trainer.grpo_trainer as gt

    import tiny

    assert isinstance(gt.AutoModelForCausalLM, DropNoneUseCache)
    assert gt.AutoModelForCausalLM.__wrapped__ is transformers.AutoModelForCausalLM
    path = tiny.save_tiny(tmp_path / "m", "llama")
    assert gt.AutoModelForCausalLM.from_pretrained(path, use_cache=None).config.use_cache is True
    assert gt.AutoModelForCausalLM.from_pretrained(path, use_cache=False).config.use_cache is False
    assert gt.AutoModelForCausalLM.from_config == transformers.AutoModelForCausalLM.from_config


@needs_warnings_affected
@pytest.mark.parametrize("case", ["qwen2-full", "llama-lora", "qwen2-beta-ref"])
def test_grpo_runs_with_patches(tmp_path, case):
    import torch

    import grpo_run

    kwargs = {
        "qwen2-full": dict(model="qwen2", beta=0.0),
        "llama-lora": dict(model="llama", peft=True, beta=0.0),
        "qwen2-beta-ref": dict(model="qwen2", beta=0.1),
    }[case]
    trainer, history = grpo_run.run_grpo(tmp_path, steps=3, **kwargs)
    losses = grpo_run.train_losses(history)
    assert len(losses) == 3 and grpo_run.finite_losses(history), history
    changed = grpo_run.changed_trainable(trainer)
    assert changed, "no trainable parameter changed"
    if case == "llama-lora":
        assert all("lora_" in name for name in changed)
        assert trainer.ref_model is None
    base = trainer.model.get_base_model() if case == "llama-lora" else trainer.model
    assert base.warnings_issued == {"estimate_tokens": True}
    if case == "qwen2-beta-ref":
        # TRL loaded the reference model itself (use_cache=None dropped) and it stayed the initial model.
        assert trainer.ref_model is not None and trainer.ref_model is not trainer.model
        kl = [e["kl"] for e in history if "kl" in e]
        assert len(kl) == 3 and all(torch.isfinite(torch.tensor(kl))) and any(v != 0 for v in kl[1:]), history
        ref = dict(trainer.ref_model.named_parameters())
        assert all(torch.equal(trainer.tiny_initial_trainable[n], ref[n].detach().cpu()) for n in changed)
