"""colocate-generation-kwargs: TRL 0.19.0's colocated vLLM merged generation_kwargs=None (the default).

* A real GRPO step with ``use_vllm=True, vllm_mode="colocate"`` on the vLLM stand-in and
  ``generation_kwargs=None`` (GRPOConfig's default; the test helper passes ``{}`` otherwise):
  unpatched on 0.19.0, ``TypeError: 'NoneType' object is not iterable`` at the first generation;
  patched, the step trains and the sampling settings are TRL's own (``{}`` adds nothing).
* Server mode is left alone (``None`` stays ``None``); the probe on the cell's TRL and on code
  written here.
"""

from __future__ import annotations

import pytest
from packaging.version import Version

from versions import installed

PID = "colocate-generation-kwargs"
TRL = installed("trl")

needs_bug = pytest.mark.skipif(
    TRL is None or TRL != Version("0.19.0") or installed("vllm") is None,
    reason=f"TRL {TRL}: the unchecked merge is 0.19.0's (with the stand-in: trl0.19.0-tf4.52.4)",
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _colocated(tmp_path):
    import grpo_run

    return grpo_run.make_trainer(tmp_path, use_vllm=True, steps=1, generation_kwargs=None)


@needs_bug
def test_bug_without_the_patch_the_first_generation_raises(tmp_path, unpatched):
    with unpatched(PID):
        trainer = _colocated(tmp_path)
        with pytest.raises(TypeError, match="'NoneType' object is not iterable"):
            trainer.train()


@needs_bug
def test_the_default_trains(tmp_path):
    import grpo_run

    trainer = _colocated(tmp_path)
    assert trainer.args.generation_kwargs == {}
    trainer.train()
    assert trainer.state.global_step == 1 and grpo_run.finite_losses(trainer.state.log_history)


@needs_bug
def test_server_mode_is_left_alone(tmp_path):
    from trl_compat.patches import colocate_generation_kwargs as patch

    class Args:
        use_vllm, vllm_mode, generation_kwargs = True, "server", None

    class Trainer:
        args = Args()

    patch._empty_where_none(Trainer(), {})
    assert Trainer.args.generation_kwargs is None


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import colocate_generation_kwargs as patch

    import trl.trainer.grpo_trainer as module

    assert patch.probe(module).needed is (TRL == Version("0.19.0"))


class _Unchecked:
    def _generate_and_score_completions(self, generation_kwargs):
        if self.args.generation_kwargs is not None:
            generation_kwargs.update(self.args.generation_kwargs)
        generation_kwargs.update(self.args.generation_kwargs)


class _Checked:
    def _generate_and_score_completions(self, generation_kwargs):
        if self.args.generation_kwargs is not None:
            generation_kwargs.update(self.args.generation_kwargs)


class _Absent:
    def _generate_and_score_completions(self):
        pass


@pytest.mark.parametrize("cls,needed", [(_Unchecked, True), (_Checked, False), (_Absent, False)])
def test_probe_on_code_written_here(cls, needed):
    import types

    from trl_compat.patches import colocate_generation_kwargs as patch

    assert patch.probe(types.SimpleNamespace(GRPOTrainer=cls)).needed is needed
