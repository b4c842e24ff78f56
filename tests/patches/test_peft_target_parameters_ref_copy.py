"""peft-target-parameters-ref-copy: TRL 1.7 - 1.9 skip the "ref" copy of a PeftModel's adapter for any LoRA
with target_parameters, also on peft >= 0.20, which accepts it (TRL 1.10.0 skips it on peft < 0.20 only).

* Stack-free: the probe's verdicts on written code (1.7's skip, 1.10's, TRL < 1.7, peft refusing or not).
* Every cell with TRL and peft: the probe on the real code ("needed" exactly on 1.7 - 1.9 with a peft
  that accepts a second target_parameters adapter).
* The cell trl1.9.2-tf5.24.0-user (peft 0.21.2; by value): a tiny Qwen2 with a non-zero LoRA on each
  ``mlp.down_proj.weight`` (``target_parameters``), ``beta=0.1``, one step. Unpatched, TRL warns that
  peft cannot copy the adapter, makes no "ref" adapter, and its reference log-probs are the base
  model's: the logged KL at the first step is the k3 mean between adapter and base (not zero).
  Patched, a "ref" adapter is there, TRL's reference log-probs are the adapter's own (computed here by
  a plain forward), the logged KL of the first step is 0, TRL's warning is held back, and the "ref"
  weights are frozen copies of the adapter's start while "default" trains.
"""

from __future__ import annotations

import logging

import trl_compat

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed

PID = "peft-target-parameters-ref-copy"
TRL, PEFT = installed("trl"), installed("peft")
IN_WINDOW = TRL is not None and PEFT is not None and Version("1.7.0") <= TRL < Version("1.10.0") and PEFT >= Version("0.20.0")
TRL_NOTICE = "PEFT can't add a frozen reference adapter"

SKIP_1_7 = (  # PR #6043, 1.7.0 - 1.9.x
    "        if is_peft_model(model) and args.beta != 0.0:\n"
    '            default_config = model.peft_config["default"]\n'
    "            if isinstance(default_config, LoraConfig) and default_config.target_parameters:\n"
    '                logger.warning("PEFT can\'t add a frozen reference adapter")\n'
    "            else:\n"
    '                model.add_adapter("ref", default_config)\n'
)
SKIP_1_10 = SKIP_1_7.replace(
    "default_config.target_parameters:",
    'default_config.target_parameters and Version(peft.__version__) < Version("0.20.0"):',
)
ALWAYS_0_27 = (  # 0.27.0 - 1.6.x
    '        if is_peft_model(model) and args.beta != 0.0:\n            model.add_adapter("ref", model.peft_config["default"])\n'
)
OTHER = (
    "        if isinstance(default_config, LoraConfig) and default_config.target_parameters:\n"
    "            pass\n"
    "        else:\n"
    "            make_ref(model)\n"
)


@pytest.mark.parametrize(
    "body, refuses, verdict",
    [
        (SKIP_1_7, False, True),
        (SKIP_1_7, True, False),
        (SKIP_1_10, False, False),
        (ALWAYS_0_27, False, False),
        (OTHER, False, None),
    ],
    ids=["1.7-peft-accepts", "1.7-peft-refuses", "1.10", "0.27", "unknown"],
)
def test_probe_on_written_code(code_module, monkeypatch, body, refuses, verdict):
    from trl_compat.patches import peft_target_parameters_ref_copy as patch

    monkeypatch.setattr(patch, "refuses_a_second_target_parameters_adapter", lambda: refuses)
    module = code_module(f"class GRPOTrainer:\n    def __init__(self, model, args=None, peft_config=None):\n{body}")
    assert patch.probe(module).needed is verdict


def test_the_filter_holds_back_trls_notice_only():
    from trl_compat.patches import peft_target_parameters_ref_copy as patch

    hold = patch._HoldTrlNotice()
    record = lambda msg: logging.LogRecord("trl.trainer.grpo_trainer", logging.WARNING, __file__, 1, msg, None, None)  # noqa: E731
    assert not hold.filter(record(f"[RANK 0] {TRL_NOTICE} alongside one that uses `target_parameters`"))
    assert hold.filter(record("some other warning"))


@pytest.mark.skipif(TRL is None or PEFT is None, reason="needs trl and peft")
def test_probe_on_the_installed_trl():
    from trl_compat.patches import peft_target_parameters_ref_copy as patch

    import trl.trainer.grpo_trainer as grpo

    verdict = patch.probe(grpo)
    # the probe reads TRL's code and whether peft refuses a second target_parameters adapter (0.17.1 - 0.19.x)
    refuses = Version("0.17.1") <= PEFT < Version("0.20.0")
    assert verdict.needed is (Version("1.7.0") <= TRL < Version("1.10.0") and not refuses), verdict


# -- real GRPO runs ----------------------------------------------------------------------------

by_value = only_in_cells("trl1.9.2-tf5.24.0-user", why="a real GRPO step on a target_parameters PeftModel")


def _window_or_skip():
    if not IN_WINDOW:
        pytest.skip(f"TRL 1.7.0 - 1.9.x on peft >= 0.20 only (here trl {TRL}, peft {PEFT})")
    pytest.importorskip("torch")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)

    assert trl_compat.status(PID) == trl_compat.APPLIED, trl_compat.report()


@by_value
def test_bug_without_the_patch_the_reference_is_the_base_model(tmp_path, unpatched, caplog):
    _window_or_skip()
    import target_parameters

    with unpatched(PID), caplog.at_level(logging.WARNING):
        step = target_parameters.run(tmp_path)
    assert list(step.model.peft_config) == ["default"]
    assert TRL_NOTICE in caplog.text
    diff = target_parameters.max_diff
    assert diff(step.adapter, step.base, step.mask) > 1e-2
    assert diff(step.trl_ref, step.base, step.mask) < 1e-4
    expected_kl = target_parameters.k3(step.base, step.adapter, step.mask)
    assert expected_kl > 1e-4 and step.kl == pytest.approx(expected_kl, rel=1e-3)


@by_value
def test_with_the_patch_the_reference_is_a_frozen_copy_of_the_adapter(tmp_path, caplog):
    _window_or_skip()
    import target_parameters

    with caplog.at_level(logging.WARNING):
        step = target_parameters.run(tmp_path)
    assert list(step.model.peft_config) == ["default", "ref"]
    assert TRL_NOTICE not in caplog.text
    diff = target_parameters.max_diff
    assert diff(step.adapter, step.base, step.mask) > 1e-2
    assert diff(step.trl_ref, step.adapter, step.mask) < 1e-4
    assert diff(step.trl_ref, step.base, step.mask) > 1e-2
    assert step.kl == pytest.approx(0.0, abs=1e-6)
    # "ref" holds the adapter's start, frozen; "default" trained
    after = dict(step.model.named_parameters())
    refs = {n.replace(".default.", ".ref."): w for n, w in step.weights_before.items()}
    assert refs and all(not after[n].requires_grad and (after[n] == w).all() for n, w in refs.items())
    assert any(not (after[n] == w).all() for n, w in step.weights_before.items())


@pytest.mark.skipif(PEFT is None or PEFT < Version("0.20.0"), reason="a second target_parameters adapter needs peft >= 0.20")
def test_the_copy_takes_the_dtype_zero3_peft_mixed_dtype_cast_to():
    """Under ZeRO-3 on DeepSpeed 0.19.2, zero3-peft-mixed-dtype (stacked outside) first casts the fp32 adapter of
    a bf16 PeftModel to bf16, where the frozen parameters share that one dtype; the copy made after it is bf16 too.
    Made before the cast, an fp32 frozen copy would leave two frozen dtypes, and the cast would not happen."""
    torch = pytest.importorskip("torch")
    from trl_compat.patches import peft_target_parameters_ref_copy as patch
    from trl_compat.patches.zero3_peft_mixed_dtype import cast_adapters

    import target_parameters

    def bf16_model():
        model = target_parameters.peft_model()
        for name, param in model.named_parameters():
            if "lora_" not in name:
                param.data = param.data.to(torch.bfloat16)
        return model

    model = bf16_model()
    assert cast_adapters(model)  # the default adapter cast to bf16
    patch.make_ref_copy(model, model.peft_config["default"])
    params = dict(model.named_parameters())
    refs = {n: p for n, p in params.items() if ".ref." in n}
    assert refs and {p.dtype for p in params.values() if not p.requires_grad} == {torch.bfloat16}
    assert all(not p.requires_grad and torch.equal(p, params[n.replace(".ref.", ".default.")]) for n, p in refs.items())

    reversed_order = bf16_model()
    patch.make_ref_copy(reversed_order, reversed_order.peft_config["default"])
    assert cast_adapters(reversed_order) == []
