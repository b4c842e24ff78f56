"""peft-target-parameters-ref-adapter: TRL 0.27.0 - 1.6.x add a "ref" copy of a PeftModel's adapter when
beta > 0, which peft 0.17.1 - 0.19.x refuse for a LoRA with target_parameters (PR #6043 skips it in 1.7.0).

* Stack-free: the probe's verdicts on written code (TRL's three shapes, and peft's refusal or not);
  the overrides skip only the "ref" adapter and answer only its missing names.
* Every cell with TRL and peft: the probe on the real code ("needed" exactly where TRL makes the
  adapter and peft refuses it).
* One cell of the window (by value): a tiny Qwen2 with LoRA on each ``mlp.down_proj.weight``
  (``target_parameters``, a non-zero adapter), ``beta=0.1``. Unpatched, ``GRPOTrainer(...)`` raises
  peft's ``ValueError``. Patched, one step trains with no "ref" adapter; TRL's reference log-probs are
  the base model's (adapter disabled, computed here by a plain forward) and not the adapter's, and the
  logged KL is the k3 mean between the adapter and the base model (not zero at the first step).
"""

from __future__ import annotations

import logging

import trl_compat

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed

PID = "peft-target-parameters-ref-adapter"
TRL, PEFT = installed("trl"), installed("peft")
IN_WINDOW = (
    TRL is not None
    and PEFT is not None
    and Version("0.27.0") <= TRL < Version("1.7.0")
    and Version("0.17.1") <= PEFT < Version("0.20.0")
)
BY_VALUE_CELLS = ("trl0.29.1-tf5.2.0", "trl1.0.0-tf4.57.6-ds0.19.2")

A_0_27 = (  # 0.27.0 - 1.6.x
    "        if is_peft_model(model) and args.beta != 0.0:\n"
    '            model.add_adapter("ref", model.peft_config["default"])\n'
    "            for name, param in model.named_parameters():\n"
    '                if ".default." in name:\n'
    '                    ref_name = name.replace(".default.", ".ref.")\n'
    "                    ref_param = model.get_parameter(ref_name)\n"
    "                    ref_param.data.copy_(param.data)\n"
)
B_1_7 = (  # PR #6043, 1.7.0 - 1.9.x (1.10.0 adds a peft version to the condition)
    "        if is_peft_model(model) and args.beta != 0.0:\n"
    '            default_config = model.peft_config["default"]\n'
    "            if isinstance(default_config, LoraConfig) and default_config.target_parameters:\n"
    '                logger.warning("PEFT can\'t add a frozen reference adapter")\n'
    "            else:\n"
    '                model.add_adapter("ref", default_config)\n'
)
NONE_0_26 = "        self.ref_model = None\n"
OTHER = '        if is_peft_model(model):\n            model.add_adapter("ref", copy.deepcopy(model.peft_config["default"]))\n'


@pytest.mark.parametrize(
    "body, refuses, verdict",
    [(A_0_27, True, True), (A_0_27, False, False), (B_1_7, True, False), (NONE_0_26, True, False), (OTHER, True, None)],
    ids=["0.27-peft-refuses", "0.27-peft-accepts", "1.7", "0.26", "unknown"],
)
def test_probe_on_written_code(code_module, monkeypatch, body, refuses, verdict):
    from trl_compat.patches import peft_target_parameters_ref_adapter as patch

    monkeypatch.setattr(patch, "refuses_a_second_target_parameters_adapter", lambda: refuses)
    module = code_module(f"class GRPOTrainer:\n    def __init__(self, model, args=None, peft_config=None):\n{body}")
    assert patch.probe(module).needed is verdict


class Adapters:
    """peft's two methods as the overrides meet them, on a stand-in model."""

    def __init__(self):
        self.peft_config = {"default": object()}
        self.added = []

    def add_adapter(self, adapter_name, peft_config, low_cpu_mem_usage=False):
        self.added.append(adapter_name)
        self.peft_config[adapter_name] = peft_config

    def get_parameter(self, target):
        if ".ref." in target or "missing" in target:
            raise AttributeError(f"no attribute {target}")
        return ("param", target)


def test_the_overrides_skip_the_ref_adapter_only(monkeypatch, caplog):
    from trl_compat.patches import peft_target_parameters_ref_adapter as patch

    model = Adapters()
    monkeypatch.setattr(patch, "target_parameters_config", lambda m: m.peft_config["default"])
    with caplog.at_level(logging.WARNING):
        with patch._skip_ref(model):
            # before the skip, a missing .ref. name is peft's error
            with pytest.raises(AttributeError, match="no attribute a.ref.w"):
                model.get_parameter("a.ref.w")
            model.add_adapter(peft_config=model.peft_config["default"], adapter_name="ref")
            model.add_adapter("other", "config")
            assert model.get_parameter(target="layer.lora_A.ref.weight") == ("param", "layer.lora_A.default.weight")
            assert model.get_parameter("layer.lora_A.default.weight") == ("param", "layer.lora_A.default.weight")
            with pytest.raises(AttributeError, match="missing"):
                model.get_parameter("layer.missing")
    assert model.added == ["other"] and "ref" not in model.peft_config
    assert "add_adapter" not in vars(model) and "get_parameter" not in vars(model)  # gone after the call
    assert "peft cannot add a second LoRA adapter with target_parameters" in caplog.text


@pytest.mark.skipif(TRL is None or PEFT is None, reason="needs trl and peft")
def test_probe_on_the_installed_trl():
    from trl_compat.patches import peft_target_parameters_ref_adapter as patch

    import trl.trainer.grpo_trainer as grpo

    verdict = patch.probe(grpo)
    assert verdict.needed is IN_WINDOW, verdict


# -- real GRPO runs ----------------------------------------------------------------------------

by_value = only_in_cells(*BY_VALUE_CELLS, why="a real GRPO step on a target_parameters PeftModel")


def _window_or_skip():
    if not IN_WINDOW:
        pytest.skip(f"TRL 0.27.0 - 1.6.x on peft 0.17.1 - 0.19.x only (here trl {TRL}, peft {PEFT})")
    pytest.importorskip("torch")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()


@by_value
def test_bug_without_the_patch_the_trainer_cannot_be_built(tmp_path, unpatched):
    _window_or_skip()
    import target_parameters

    with unpatched(PID):
        with pytest.raises(ValueError, match=r"only one LoRA adapter per model with `target_parameters` is allowed"):
            target_parameters.run(tmp_path)


@by_value
def test_with_the_patch_the_reference_is_the_base_model(tmp_path, caplog):
    _window_or_skip()
    import target_parameters

    with caplog.at_level(logging.WARNING):
        step = target_parameters.run(tmp_path)
    assert list(step.model.peft_config) == ["default"]
    assert "peft cannot add a second LoRA adapter with target_parameters" in caplog.text
    diff = target_parameters.max_diff
    # the adapter moves the log-probs: the two candidates for the reference are far apart
    assert diff(step.adapter, step.base, step.mask) > 1e-2
    assert diff(step.trl_ref, step.base, step.mask) < 1e-4
    expected_kl = target_parameters.k3(step.base, step.adapter, step.mask)
    assert expected_kl > 1e-4
    assert step.kl == pytest.approx(expected_kl, rel=1e-3)
    # the adapter trained, the base weights the overrides touched (get_parameter's self-copy) did not change
    after = dict(step.model.named_parameters())
    assert all("lora_" in n and ".default." in n for n in step.weights_before)
    assert any(not (after[n] == w).all() for n, w in step.weights_before.items())
