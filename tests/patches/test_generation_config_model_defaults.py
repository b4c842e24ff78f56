"""generation-config-model-defaults: on transformers 4.50 - 4.57, TRL < 0.26.2 samples with the
model's generation defaults wherever TRL's value equals the global default.

* The probe on the real TRL of the cell (which method samples, needed / fixed by PR #4647 / not
  needed on transformers without ``use_model_defaults``) and on code written here.
* Real GRPO runs without vLLM on a tiny checkpoint whose ``generation_config.json`` (saved by the
  running transformers) holds temperature=0.05, top_p=0.5, top_k=3. The config ``generate``
  really used (``_prepare_generation_config``'s result) and the logits warpers it built are
  recorded. With the patch reverted (cells in the window), TRL's temperature=1.0 / top_p=1.0 are
  replaced by 0.05 / 0.5 (the bug); with it, the config used is TRL's field for field and no
  temperature or top-p warper is built. TRL's temperature=0.9 is kept either way. Where the patch
  is "not needed" (TRL 0.26.2+, transformers < 4.50) TRL's settings are used without it.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat
from trl_compat.patches import generation_config_model_defaults as gcmd

from packaging.version import Version

from versions import installed

PID = "generation-config-model-defaults"

TRL = installed("trl")
TRANSFORMERS = installed("transformers")
MODEL_DEFAULTS = {"temperature": 0.05, "top_p": 0.5, "top_k": 3}
WARPERS = {"TemperatureLogitsWarper": "temperature", "TopPLogitsWarper": "top_p", "TopKLogitsWarper": "top_k"}
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "do_sample")

FILLS_BY_VALUE = TRANSFORMERS is not None and Version("4.50.0") <= TRANSFORMERS < Version("5.0.0")
IN_WINDOW = TRL is not None and Version("0.14.0") <= TRL < Version("0.26.2") and FILLS_BY_VALUE
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL} x transformers {TRANSFORMERS}: outside the bug's window")
outside_window = pytest.mark.skipif(
    TRL is None or IN_WINDOW or TRANSFORMERS >= Version("5.0.0"),
    reason="the bug is there (or transformers 5, not run here): see the tests above",
)


def _expected_method():
    if TRL < Version("0.15.0"):
        return "compute_loss"
    if TRL < Version("0.16.0"):
        return "_prepare_inputs"
    if TRL < Version("0.24.0"):
        return "_generate_and_score_completions"
    return "_generate_single_turn"


# -- the probe ----------------------------------------------------------------------------------


@needs_trl
def test_status_and_probe_on_the_real_trl():
    from trl.trainer import grpo_trainer

    status = {r.id: r for r in trl_compat.report()}[PID]
    verdict = gcmd.probe(grpo_trainer)
    if IN_WINDOW:
        assert status.status == trl_compat.APPLIED, status
        assert status.target == "transformers.generation.utils.GenerationMixin.generate"
        assert verdict.needed is True, verdict
        assert f"GRPOTrainer.{_expected_method()} calls generate(generation_config=self.generation_config)" in verdict.reason
        assert "use_model_defaults=False" in verdict.reason
        return
    assert status.status == trl_compat.NOT_NEEDED, status
    assert verdict.needed is False, verdict
    if not FILLS_BY_VALUE:
        assert "has no use_model_defaults" in verdict.reason
    else:  # TRL 0.26.2+: the probe finds PR #4647 in the code
        assert f"GRPOTrainer.{_expected_method()} makes the model's generation_config TRL's" in verdict.reason


class _Buggy:
    def _generate_and_score_completions(self, inputs):
        with unwrap_model_for_generation(self.model_wrapped, self.accelerator) as unwrapped_model:  # noqa: F821
            return unwrapped_model.generate(inputs, generation_config=self.generation_config)


class _Fixed:
    def _generate_single_turn(self, prompts):
        with unwrap_model_for_generation(  # noqa: F821
            self.model_wrapped, self.accelerator, generation_kwargs=self.generation_kwargs
        ) as unwrapped_model:
            return unwrapped_model.generate(prompts, generation_config=self.generation_config)


class _VllmOnly:
    def _generate_and_score_completions(self, inputs):
        return self.llm.generate(inputs, sampling_params=self.sampling_params)


@pytest.mark.parametrize(
    "cls, needed, snippet",
    [
        (_Buggy, True, "GRPOTrainer._generate_and_score_completions calls generate("),
        (_Fixed, False, "(PR #4647)"),
        (_VllmOnly, None, "the way this patch expects"),
    ],
)
def test_probe_on_code_written_here(monkeypatch, cls, needed, snippet):
    import types

    trainer = type("GRPOTrainer", (cls,), {"__module__": "trl.trainer.grpo_trainer"})
    monkeypatch.setattr(cls, "__module__", "trl.trainer.grpo_trainer")
    monkeypatch.setattr(gcmd, "_generate_takes_use_model_defaults", lambda: True)
    verdict = gcmd.probe(types.SimpleNamespace(GRPOTrainer=trainer))
    assert verdict.needed is needed and snippet in verdict.reason, verdict


@pytest.mark.skipif(TRANSFORMERS is None, reason="transformers is not installed")
def test_probe_reads_use_model_defaults_from_the_installed_generate(monkeypatch):
    monkeypatch.setattr(gcmd, "_sampling_methods", lambda cls: pytest.fail("read TRL before transformers"))
    if FILLS_BY_VALUE:
        assert gcmd._generate_takes_use_model_defaults()
        return
    verdict = gcmd.probe(None)
    assert verdict.needed is False and "has no use_model_defaults" in verdict.reason


# -- real GRPO runs -------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _trigger():
    """Import the trigger module first, so the status is decided before a test reads it."""
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401


class _Spy:
    """What generate really used: ``_prepare_generation_config``'s config and the warpers built."""

    def __init__(self, monkeypatch):
        from transformers.generation.utils import GenerationMixin

        self.configs, self.warpers = [], []
        prepare, processors = GenerationMixin._prepare_generation_config, GenerationMixin._get_logits_processor

        def spy_prepare(model, *args, **kwargs):
            out = prepare(model, *args, **kwargs)
            self.configs.append({field: getattr(out[0], field, None) for field in SAMPLING_FIELDS})
            return out

        def spy_processors(model, *args, **kwargs):
            out = processors(model, *args, **kwargs)
            self.warpers.append({type(p).__name__: getattr(p, WARPERS[type(p).__name__]) for p in out if type(p).__name__ in WARPERS})
            return out

        monkeypatch.setattr(GenerationMixin, "_prepare_generation_config", spy_prepare)
        monkeypatch.setattr(GenerationMixin, "_get_logits_processor", spy_processors)


def _run(tmp_path, monkeypatch, **config):
    import grpo_run
    import tiny

    path = tiny.save_tiny_with_generation_defaults(tmp_path / "checkpoint", **MODEL_DEFAULTS)
    trainer = grpo_run.make_trainer(tmp_path, model=path, steps=1, **config)
    model = trainer.model.get_base_model() if hasattr(trainer.model, "get_base_model") else trainer.model
    assert model.generation_config.temperature == MODEL_DEFAULTS["temperature"]
    spy = _Spy(monkeypatch)
    trainer.train()
    assert spy.configs and len(spy.configs) == len(spy.warpers), "TRL never called generate"
    # the model's own generation_config (what save_pretrained writes) is left as it was
    assert {k: getattr(model.generation_config, k) for k in MODEL_DEFAULTS} == MODEL_DEFAULTS
    trl = {field: getattr(trainer.generation_config, field, None) for field in SAMPLING_FIELDS}
    return trl, spy


@needs_bug
def test_without_the_patch_generate_samples_at_the_models_defaults(tmp_path, monkeypatch, unpatched):
    with unpatched(PID):
        trl, spy = _run(tmp_path, monkeypatch, temperature=1.0, top_p=1.0)
    assert trl["temperature"] == 1.0 and trl["top_p"] == 1.0
    for used, warpers in zip(spy.configs, spy.warpers):
        assert used["temperature"] == 0.05 and used["top_p"] == 0.5, used  # the bug
        assert warpers["TemperatureLogitsWarper"] == 0.05 and warpers["TopPLogitsWarper"] == 0.5, warpers
        # TRL 0.14-0.15 leave top_k unset, 0.16-0.19 default it to 50 (both the global default): the model's 3;
        # 0.20+'s top_k=None differs from the default and is kept
        assert used["top_k"] == (3 if trl["top_k"] == 50 else trl["top_k"]), (used, trl)


@needs_bug
@pytest.mark.parametrize("peft", [False, True], ids=["full", "lora"])
def test_with_the_patch_generate_samples_with_trls_settings(tmp_path, monkeypatch, peft):
    if peft and installed("peft") is None:
        pytest.skip("peft is not installed")
    assert trl_compat.status(PID) == trl_compat.APPLIED
    # under LoRA, PeftModel.generate calls the base model's generate: TRL's frame is further up
    trl, spy = _run(tmp_path, monkeypatch, peft=peft, temperature=1.0, top_p=1.0)
    for used, warpers in zip(spy.configs, spy.warpers):
        assert used == trl, (used, trl)
        assert used["temperature"] == 1.0 and used["top_p"] == 1.0
        assert "TemperatureLogitsWarper" not in warpers and "TopPLogitsWarper" not in warpers, warpers
        assert warpers.get("TopKLogitsWarper") == (trl["top_k"] or None), warpers


@needs_bug
@pytest.mark.parametrize("patched", [True, False], ids=["patched", "unpatched"])
def test_trls_own_temperature_is_kept_either_way(tmp_path, monkeypatch, unpatched, patched):
    import contextlib

    with contextlib.nullcontext() if patched else unpatched(PID):
        trl, spy = _run(tmp_path, monkeypatch, temperature=0.9)
    assert trl["temperature"] == 0.9
    for used, warpers in zip(spy.configs, spy.warpers):
        assert used["temperature"] == 0.9 and warpers["TemperatureLogitsWarper"] == 0.9, (used, warpers)


@outside_window
def test_not_needed_generate_samples_with_trls_settings(tmp_path, monkeypatch):
    assert trl_compat.status(PID) == trl_compat.NOT_NEEDED
    trl, spy = _run(tmp_path, monkeypatch, temperature=1.0, top_p=1.0)
    for used, warpers in zip(spy.configs, spy.warpers):
        assert used == trl, (used, trl)
        assert "TemperatureLogitsWarper" not in warpers and "TopPLogitsWarper" not in warpers, warpers
