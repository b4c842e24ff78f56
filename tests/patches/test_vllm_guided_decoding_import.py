"""vllm-guided-decoding-import: TRL 0.16 - 0.26.2 import vLLM's ``GuidedDecodingParams``, which vLLM
0.12 removed, and pass ``guided_decoding=`` to ``SamplingParams``.

* Every cell with TRL: the probe on the real TRL source files, read without importing them (which
  modules import the name unconditionally: vllm-serve from 0.16, the GRPO trainer from 0.18, none
  from 0.27), and the patch's pieces on their own.
* TRL in the window with vLLM >= 0.12 (the trl0.26.2-tf4.57.3 cell: the stand-in as vLLM 0.14.0,
  whose ``vllm.sampling_params`` has 0.12's layout): in fresh interpreters, ``from trl import
  GRPOTrainer`` fails with ``ImportError: cannot import name 'GuidedDecodingParams'`` when the patch
  is switched off, and succeeds with it; TRL's own ``SamplingParams`` globals (the trainer's and
  ``trl vllm-serve``'s) reject ``guided_decoding=`` without the patch and hand it to vLLM as
  ``structured_outputs=`` with it; a real GRPO run (``use_vllm=False``: having vLLM installed was
  enough to break it) trains; where the stand-in's colocate mode is wired for this TRL, a real
  ``use_vllm=True`` run generates through ``SamplingParams(guided_decoding=None, ...)``.
"""

import subprocess
import sys

import trl_compat
from trl_compat.patches import vllm_guided_decoding_import as patch_module

import pytest
from packaging.version import Version

pytest.importorskip("torch")  # grpo_run and tiny build torch models: not in the notrl cell

import grpo_run
from versions import installed
from workers import SUPPORT, fresh_trainer_import

PATCH_ID = "vllm-guided-decoding-import"
TRL, VLLM = installed("trl"), installed("vllm")
IN_WINDOW = TRL is not None and Version("0.16.0") <= TRL < Version("0.27.0")
IN_CELL = IN_WINDOW and VLLM is not None and VLLM >= Version("0.12.0")
in_cell = pytest.mark.skipif(not IN_CELL, reason="TRL 0.16 - 0.26.2 with vLLM >= 0.12 only (the trl0.26.2-tf4.57.3 cell)")
IMPORT_ERROR = "cannot import name 'GuidedDecodingParams' from 'vllm.sampling_params'"


def expected_importers():
    if TRL is None or not IN_WINDOW:
        return []
    return (["trl.trainer.grpo_trainer"] if TRL >= Version("0.18.0") else []) + ["trl.scripts.vllm_serve"]


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_probe_reads_which_trl_modules_import_the_removed_name():
    found, unreadable = patch_module.importers()
    assert unreadable == []
    assert found == expected_importers()
    verdict = patch_module.probe(sys.modules.get("trl"))
    assert verdict.needed is bool(found), verdict
    if found:
        assert "import GuidedDecodingParams, which vLLM >= 0.12 removed" in verdict.reason


def test_the_shims_on_their_own():
    class Structured:
        def __init__(self, regex=None, json=None):
            self.regex, self.json = regex, json

    shim = patch_module.guided_decoding_params(Structured)
    params = shim(regex="a|b", backend="outlines")  # TRL 0.16's vllm-serve passes backend=
    assert isinstance(params, Structured) and params.regex == "a|b"

    received = []

    def sampling_params(n=1, structured_outputs=None):
        received.append((n, structured_outputs))

    assert not patch_module.takes(sampling_params, "guided_decoding")
    renamed = patch_module.renaming(sampling_params)
    renamed(n=2, guided_decoding=params)
    renamed(n=3, guided_decoding=None)
    renamed(n=4)
    assert received == [(2, params), (3, None), (4, None)]


@in_cell
def test_unpatched_import_of_the_trainer_fails():
    out = fresh_trainer_import(PATCH_ID, disable=PATCH_ID)
    assert out.returncode != 0, out.stdout
    assert IMPORT_ERROR in out.stderr, out.stderr[-3000:]


@in_cell
def test_patched_import_of_the_trainer_succeeds():
    out = fresh_trainer_import(PATCH_ID)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "STATUS applied" in out.stdout, out.stdout


def trl_sampling_params_globals():
    import trl.scripts.vllm_serve as serve
    import trl.trainer.grpo_trainer as grpo

    return {"trl.trainer.grpo_trainer": grpo, "trl.scripts.vllm_serve": serve}


@in_cell
def test_unpatched_sampling_params_reject_guided_decoding(unpatched):
    modules = trl_sampling_params_globals()
    with unpatched(PATCH_ID):
        import vllm.sampling_params

        assert not hasattr(vllm.sampling_params, "GuidedDecodingParams")
        for module in modules.values():
            with pytest.raises(TypeError, match="guided_decoding"):
                module.SamplingParams(n=1, max_tokens=8, guided_decoding=None)


@in_cell
def test_patched_sampling_params_pass_it_as_structured_outputs():
    import vllm.sampling_params

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    for name, module in trl_sampling_params_globals().items():
        # what TRL's module bound at its import: the name vLLM 0.12 lost, built as its successor
        guided = module.GuidedDecodingParams(regex="yes|no")
        assert isinstance(guided, vllm.sampling_params.StructuredOutputsParams) and guided.regex == "yes|no"
        params = module.SamplingParams(n=2, max_tokens=8, guided_decoding=guided)
        assert isinstance(params, vllm.sampling_params.SamplingParams), name
        assert params.structured_outputs is guided and params.n == 2 and params.max_tokens == 8
        assert module.SamplingParams(n=1, guided_decoding=None).structured_outputs is None


@in_cell
def test_grpo_run_without_vllm_generation_trains(tmp_path):
    trainer, history = grpo_run.run_grpo(tmp_path, steps=1)
    assert grpo_run.finite_losses(history), history
    assert grpo_run.changed_trainable(trainer)


COLOCATE_SCRIPT = """
import tempfile

import trl_compat
import grpo_run

trainer = grpo_run.make_trainer(tempfile.mkdtemp(), use_vllm=True, steps=1)
trainer.train()
print("PATCHED", trainer.llm.generate_calls, grpo_run.finite_losses(trainer.state.log_history))
trl_compat.revert("vllm-guided-decoding-import")
trainer = grpo_run.make_trainer(tempfile.mkdtemp(), use_vllm=True, steps=1)
try:
    trainer.train()
except TypeError as exc:
    print("UNPATCHED", exc)
"""


@in_cell
def test_colocate_generation_builds_sampling_params():
    """Where the stand-in's colocate mode is wired for this TRL: a real ``use_vllm=True`` run, in a
    fresh interpreter (TRL's colocate mode leaves rendezvous variables and accelerate state behind
    that would turn later trainers of this process into DDP ones)."""
    reason = grpo_run.vllm_unsupported_reason()
    if reason is not None:
        pytest.skip(reason)
    out = subprocess.run([sys.executable, "-c", COLOCATE_SCRIPT], cwd=SUPPORT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    patched = [line.split() for line in out.stdout.splitlines() if line.startswith("PATCHED ")]
    assert patched and int(patched[0][1]) > 0 and patched[0][2] == "True", out.stdout
    assert "UNPATCHED" in out.stdout and "unexpected keyword argument 'guided_decoding'" in out.stdout, out.stdout + out.stderr[-3000:]
