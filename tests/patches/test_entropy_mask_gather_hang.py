"""entropy-mask-gather-hang: ``top_entropy_quantile < 1`` on 2 processes (TRL 0.21.0 - 0.23.0).

The 2-process tests launch ``tests/support/entropy_worker.py`` under ``torch.distributed.run``
(gloo, CPU): real GRPO steps on a tiny Qwen2 whose ranks hold different numbers of completion
tokens (max_completion_length 8 and 5). Without the patch TRL 0.22's gather of unequal lengths
hangs or gloo raises: the launch is killed (its whole process group) once both ranks entered
``get_high_entropy_mask`` and none left it within a grace period, or it fails with gloo's error.
With the patch both ranks finish and compute the same threshold: the quantile of both ranks'
entropies together. About 40-90 s per launch on 2 cores.
"""

import os
import signal
import subprocess
import threading
import time

import pytest
from packaging.version import Version

torch = pytest.importorskip("torch")

import written_code
from versions import installed
from workers import SUPPORT, Run, two_process_launch

PATCH_ID = "entropy-mask-gather-hang"
TRL = installed("trl")
AFFECTED = TRL is not None and Version("0.21.0") <= TRL < Version("0.23.1")
needs_affected = pytest.mark.skipif(not AFFECTED, reason=f"only TRL 0.21.0 - 0.23.0 (here trl {TRL})")
GLOO_SIZE_ERROR = "op.preamble.length <= op.nbytes"


def launch(model_dir, out_dir, disable="", timeout=480, hang_grace=60):
    """Both ranks of entropy_worker.py; returns ``(Run, hung)``. ``hung``: both ranks entered
    ``get_high_entropy_mask`` more often than they left it and nothing came for ``hang_grace``
    seconds, or the launch ran past ``timeout``; then the process group is killed."""
    cmd, env = two_process_launch("entropy_worker.py", model_dir, out_dir, disable=disable)
    proc = subprocess.Popen(
        cmd, env=env, cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    )
    chunks, last = [], [time.monotonic()]

    def read():
        for line in proc.stdout:
            chunks.append(line)
            last[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    start, hung = time.monotonic(), False
    while proc.poll() is None:
        time.sleep(1)
        output = "".join(chunks)
        waiting = output.count('"event": "enter"') > output.count('"event": "mask"')
        if (waiting and time.monotonic() - last[0] > hang_grace) or time.monotonic() - start > timeout:
            hung = True
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both ranks
            break
    proc.wait()
    reader.join(timeout=10)
    return Run(proc.returncode, "".join(chunks), "EM|"), hung


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("entropy") / "tiny_qwen2", "qwen2")


# -- probe -------------------------------------------------------------------------------------


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_installed_trl():
    from trl_compat.patches import entropy_mask_gather_hang as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    if AFFECTED:
        assert verdict.needed is True and "pad_across_processes" in verdict.reason, verdict
    else:
        assert verdict.needed is False, verdict


@pytest.mark.parametrize(
    "body, kind",
    [
        # 0.23.0: lengths gathered and padded by hand, early return on an empty rank
        (
            "if local.numel() == 0: return local\nn = self.accelerator.gather(torch.tensor([local.numel()]))\n"
            "return self.accelerator.gather(local)",
            "needed",
        ),
        # 0.24.0
        (
            "padded = self.accelerator.pad_across_processes(local, dim=0, pad_index=-1e9)\nreturn self.accelerator.gather(padded)",
            "not_needed",
        ),
        ("return local", "undecided"),
    ],
)
def test_probe_on_written_code(tmp_path, body, kind):
    import textwrap

    from trl_compat.patches import entropy_mask_gather_hang as patch

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        "class GRPOTrainer:\n    def get_high_entropy_mask(self, entropies, mask, threshold):\n"
        "        local = entropies[mask.bool()]\n" + textwrap.indent(body, " " * 8) + "\n"
    )
    module = written_code.load(path)
    assert patch.probe(module).needed is {"needed": True, "not_needed": False, "undecided": None}[kind]


# -- 2 processes -------------------------------------------------------------------------------


@needs_affected
def test_gather_hangs_without_patch(model_dir, tmp_path):
    run, hung = launch(model_dir, tmp_path / "out", disable=PATCH_ID)
    assert not run.of("done"), run.tail()
    assert [e["status"] for e in run.of("versions")] == ["disabled", "disabled"], run.tail()
    assert len(run.of("enter")) >= 2, run.tail()  # both ranks reached the gather
    # Rank 1 (5-token completions: the shorter buffer) never gets a threshold out of it; rank 0 may: gloo can
    # deliver rank 1's shorter message into rank 0's longer buffer (the rest uninitialised) before rank 1 aborts.
    assert not run.of("mask", rank=1), run.tail()
    assert hung or GLOO_SIZE_ERROR in run.output, run.tail()


@needs_affected
def test_global_threshold_with_patch(model_dir, tmp_path):
    run, hung = launch(model_dir, tmp_path / "out")
    assert not hung and run.returncode == 0, run.tail()
    assert [e["status"] for e in run.of("versions")] == ["applied", "applied"], run.tail()
    assert len(run.of("done")) == 2, run.tail()
    calls = [run.of("mask", rank=rank) for rank in (0, 1)]
    assert len(calls[0]) == len(calls[1]) >= 2, run.tail()  # one per training step and rank
    for first, second in zip(*calls):
        assert len(first["local"]) != len(second["local"])  # the ranks held different token counts
        assert first["q"] == second["q"] == pytest.approx(0.8)  # 1 - top_entropy_quantile
        assert len(first["thresholds"]) == len(second["thresholds"]) == 1
        assert first["thresholds"] == second["thresholds"]  # one threshold for all ranks
        both = torch.tensor(first["local"] + second["local"], dtype=torch.float32)
        assert first["thresholds"][0] == pytest.approx(float(torch.quantile(both, first["q"])), rel=1e-6)
    losses = run.per_rank("train")
    assert all(len(e["losses"]) == 2 for e in losses), losses


# -- one process: TRL's own unit tests ---------------------------------------------------------
# The cases of TRL's GetHighEntropyMaskTester (tests/test_grpo_trainer.py, 0.21.0 - 0.23.0), called as
# TRL calls them: the real GRPOTrainer.get_high_entropy_mask on a Mock(spec=GRPOTrainer) whose accelerator
# is a bare Mock with num_processes = 1 and an identity gather. (entropies, mask, threshold, expected mask)
UPSTREAM_ENTROPIES = [[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]]
UPSTREAM_MASK = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
UPSTREAM_CASES = {
    "mask_0": (UPSTREAM_ENTROPIES, UPSTREAM_MASK, 0.8, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]]),
    "mask_1": (
        [[0.1, 0.2, 0.3, 1.4, 0.5, 0.14], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]],
        [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]],
        0.8,
        [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]],
    ),
    "mask_lower_threshold": (UPSTREAM_ENTROPIES, UPSTREAM_MASK, 0.5, [[0, 0, 0, 0, 0, 1], [1, 1, 1, 1, 0, 0]]),
    "threshold_0": (UPSTREAM_ENTROPIES, UPSTREAM_MASK, 0.0, [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]),
    "threshold_1": (UPSTREAM_ENTROPIES, UPSTREAM_MASK, 1.0, [[0, 0, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]]),
    "all_masked": (UPSTREAM_ENTROPIES, [[0] * 6, [0] * 6], 0.5, [[0] * 6, [0] * 6]),
}


@needs_affected
@pytest.mark.parametrize("case", sorted(UPSTREAM_CASES))
def test_trl_unit_tests_on_one_process_with_patch(case):
    from unittest.mock import Mock

    import trl_compat
    from trl_compat._engine import markers

    from trl import GRPOTrainer

    assert trl_compat.status(PATCH_ID) == "applied"
    assert PATCH_ID in markers(GRPOTrainer.get_high_entropy_mask)  # the wrapper is what TRL's test calls
    entropies, mask, threshold, expected = UPSTREAM_CASES[case]
    trainer = Mock(spec=GRPOTrainer)
    trainer.accelerator = Mock()
    trainer.accelerator.num_processes = 1
    trainer.accelerator.gather = lambda x: x
    got = GRPOTrainer.get_high_entropy_mask(trainer, torch.tensor(entropies), torch.tensor(mask), threshold)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.bool))
