"""generation-batch-size-check: TRL 0.18.0 - 0.19.0 let a generation_batch_size the global batch does not divide pass.

The 2-process tests launch ``tests/support/generation_batch_worker.py`` under ``torch.distributed.run``
(gloo, CPU): 2 per device on 2 processes, a global batch of 4, the 16 prompts in order.

* Unpatched, ``generation_batch_size=6`` is accepted (``steps_per_generation`` 6 // 4 = 1), and:
  with ``num_generations=2, num_iterations=2``, 6 steps train on prompts 0, 1, 1, 2, 3, 5: prompt 1
  twice, prompt 4 never (no error); with ``num_generations=3`` the first step raises ``shape '[-1, 3]'
  is invalid for input of size 4`` on both ranks.
* Patched, the same config is refused on both ranks when built, with 0.19.1's message, and a valid
  ``generation_batch_size=4`` trains on prompts 0 - 5 once each.
* In one process (the global batch faked to 4 by ``world_size = 2``), the same, cheaply; with a real
  single process the two checks agree and TRL's own message stands.
* The probe on the cell's TRL and on code written here. About 90 s per 6-step launch on 2 cores: the
  default run (trl0.19.0) launches the silent bug and the refusal; the crash and the valid run launch in
  the by-hand trl0.18.2 cell (and in every local run).
"""

from __future__ import annotations

import os
import types
from collections import Counter

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

PID = "generation-batch-size-check"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("0.18.0") <= TRL < Version("0.19.1")
needs_bug = pytest.mark.skipif(not AFFECTED, reason=f"TRL {TRL}: the unparenthesised check is 0.18.0 - 0.19.0's")
REFUSED = "generation_batch_size (6) must be divisible by the global batch size (4)."
CELL = os.environ.get("TRL_COMPAT_CELL", "")
BY_HAND_LAUNCH_CELL = "trl0.18.2-tf4.52.4"
by_hand_launch = pytest.mark.skipif(
    bool(CELL) and CELL != BY_HAND_LAUNCH_CELL,
    reason=f"a further 2-process launch of generation-batch-size-check: run in {BY_HAND_LAUNCH_CELL} (the default run keeps two)",
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_config  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("generation-batch") / "tiny_qwen2", "qwen2")


def _launch(model_dir, tmp_path, num_generations, generation_batch_size, num_iterations, steps, disable=""):
    args = (model_dir, tmp_path / "out", num_generations, generation_batch_size, num_iterations, steps)
    return launch_two("generation_batch_worker.py", *args, marker="GB|", disable=disable)


def _trained_prompts(run):
    """Prompt index -> how many generations scored it (both ranks; each rank's calls hold one prompt's group)."""
    counts = Counter()
    for event in run.of("generate"):
        counts.update(set(event["prompts"]))
    return dict(sorted(counts.items()))


# -- 2 processes -----------------------------------------------------------------------------------


@needs_bug
def test_bug_without_the_patch_some_prompts_are_never_trained_and_others_twice(model_dir, tmp_path):
    run = _launch(model_dir, tmp_path, 2, 6, 2, 6, disable=PID)
    assert run.returncode == 0, run.tail()
    assert [e["steps_per_generation"] for e in run.per_rank("config")] == [1, 1]
    assert [e["prompts"] for e in run.of("generate", rank=0)] == [[0, 0], [1, 1], [5, 5]]
    assert [e["prompts"] for e in run.of("generate", rank=1)] == [[1, 1], [2, 2], [3, 3]]
    assert _trained_prompts(run) == {0: 1, 1: 2, 2: 1, 3: 1, 5: 1}  # prompt 4 never
    assert [e["steps"] for e in run.per_rank("done")] == [6, 6]


@needs_bug
@by_hand_launch
def test_bug_without_the_patch_a_group_straddles_two_steps_and_the_first_step_raises(model_dir, tmp_path):
    run = _launch(model_dir, tmp_path, 3, 6, 1, 2, disable=PID)
    assert run.returncode != 0
    errors = run.per_rank("error")
    assert {(e["type"], e["message"]) for e in errors} == {("RuntimeError", "shape '[-1, 3]' is invalid for input of size 4")}


@needs_bug
def test_the_config_is_refused_on_every_rank_when_built(model_dir, tmp_path):
    run = _launch(model_dir, tmp_path, 2, 6, 2, 6)
    assert [e["status"] for e in run.per_rank("versions")] == ["applied", "applied"]
    assert [e.get("error") for e in run.per_rank("config")] == [REFUSED, REFUSED]
    assert run.of("generate") == []


@needs_bug
@by_hand_launch
def test_a_valid_generation_batch_trains_every_prompt_once(model_dir, tmp_path):
    run = _launch(model_dir, tmp_path, 2, 4, 2, 6)
    assert run.returncode == 0, run.tail()
    assert _trained_prompts(run) == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}
    assert [e["steps"] for e in run.per_rank("done")] == [6, 6]


# -- one process -----------------------------------------------------------------------------------


def _two_process_config(tmp_path, **settings):
    """A GRPOConfig that sees 2 processes: the global batch is per_device_train_batch_size * 2."""
    from trl import GRPOConfig

    import grpo_run

    class TwoProcesses(GRPOConfig):
        world_size = property(lambda self: 2)

    fields = dict(output_dir=str(tmp_path), report_to="none", bf16=False, use_cpu=True, per_device_train_batch_size=2)
    fields.update(num_generations=grpo_run.NUM_GENERATIONS, **settings)
    return TwoProcesses(**fields)


@needs_bug
def test_bug_without_the_patch_the_check_reads_only_the_per_device_batch(tmp_path, unpatched):
    with unpatched(PID):
        config = _two_process_config(tmp_path, generation_batch_size=6)
    assert (config.generation_batch_size, config.steps_per_generation) == (6, 1)


@needs_bug
def test_the_check_reads_the_global_batch(tmp_path):
    with pytest.raises(ValueError) as caught:
        _two_process_config(tmp_path, generation_batch_size=6)
    assert str(caught.value) == REFUSED
    config = _two_process_config(tmp_path, generation_batch_size=8)
    assert (config.generation_batch_size, config.steps_per_generation) == (8, 2)


@needs_bug
def test_one_process_keeps_trls_own_check(tmp_path):
    import grpo_run

    with pytest.raises(ValueError) as caught:
        grpo_run.make_config(tmp_path, per_device_train_batch_size=4, generation_batch_size=6)
    assert str(caught.value) == "generation_batch_size (6) must be divisible by the global batch size (4)."
    config, _ = grpo_run.make_config(tmp_path, per_device_train_batch_size=4, generation_batch_size=8)
    assert config.steps_per_generation == 2


# -- probe -----------------------------------------------------------------------------------------


@pytest.mark.skipif(TRL is None, reason="needs TRL")
def test_probe_on_the_cells_trl():
    from trl_compat.patches import generation_batch_size_check as patch

    import trl.trainer.grpo_config as module

    assert patch.probe(module).needed is AFFECTED


class _Buggy:
    def __post_init__(self):
        num_processes = 2
        if self.generation_batch_size % self.per_device_train_batch_size * num_processes != 0:
            raise ValueError


class _Fixed:
    def __post_init__(self):
        num_processes = 2
        if self.generation_batch_size % (self.per_device_train_batch_size * num_processes) != 0:
            raise ValueError


class _Absent:
    def __post_init__(self):
        pass


class _Unknown:
    def __post_init__(self):
        if self.generation_batch_size % self.global_batch:
            raise ValueError


@pytest.mark.parametrize("cls,needed", [(_Buggy, True), (_Fixed, False), (_Absent, False), (_Unknown, None)])
def test_probe_on_code_written_here(cls, needed):
    from trl_compat.patches import generation_batch_size_check as patch

    assert patch.probe(types.SimpleNamespace(GRPOConfig=cls)).needed is needed
