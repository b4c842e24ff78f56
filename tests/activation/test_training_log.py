"""trl_compat's line in the training log, and its ids in the logged metrics, seen from a GRPO
script that never imports trl_compat and configures no logging (tests/support/training_log_script.py),
run in real processes: under ``trl-compat run``, under ``TRL_COMPAT_AUTO=1``, with
``TRL_COMPAT_QUIET=1``, under transformers' and the root's logging, and in a 2-process launch.
Also a ``TRL_COMPAT_STRICT=1`` failure during TRL's lazy import: raised as TrlCompatError."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import trl_compat
from trl_compat import activation
from trl_compat._helpers import training_log

import pytest

from cells import engine_cells
from versions import installed
from workers import SUPPORT

SCRIPT = os.path.join(SUPPORT, "training_log_script.py")
# the tree's copies: an installed wheel puts them at the site-packages root, not in the package
SITE_FILES = os.path.join(os.path.dirname(__file__), "..", "..", "trl_compat", "activation", "site_files")
BIN = os.path.dirname(sys.executable)
TRL = installed("trl")
LINE_START = f"trl_compat {trl_compat.__version__}: fixes that "
NUMBERS = "fixes that change this run's numbers: "
CRASHES = "fixes that prevent a crash: "

# real processes of trl_compat's own machinery (about 105 s a cell): in the engine cells only (cells.py),
# of which trl0.15.2-tf4.48.3 is the one in this file's TRL range
pytestmark = [
    pytest.mark.skipif(
        TRL is None or not str(TRL).startswith(("0.14.", "0.15.", "0.16.", "0.17.", "0.18.", "0.19.")),
        reason="needs a TRL whose GRPOTrainer trl_compat knows",
    ),
    engine_cells,
]


def base_env(**extra):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in (activation.SWITCH, "PYTHONPATH", "TRL_COMPAT_QUIET", "TRL_COMPAT_STRICT", "TRL_COMPAT_DISABLE")
    }
    env.update(
        PATH=BIN + os.pathsep + env.get("PATH", ""), OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1", **extra
    )
    return env


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("training_log") / "tiny_qwen2", "qwen2")


def run(cmd, env, timeout=300):
    out = subprocess.run(cmd, env=env, cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-6000:]
    ranks = [json.loads(line[len("TLOG|") :]) for line in out.stdout.splitlines() if line.startswith("TLOG|")]
    lines = [line[line.index(LINE_START) :] for line in out.stdout.splitlines() if LINE_START in line]
    return ranks, lines, out.stdout


def fixes_named(line):
    """The ids the line names as active, checked against what each fixes: a bug that trains
    silently wrong under "change this run's numbers", a crash under "prevent a crash"."""
    assert line.endswith("details: python -m trl_compat"), line
    parts = line.split(": ", 1)[1].split("; ")
    named = {}
    for part in parts:
        for prefix in (NUMBERS, CRASHES):
            if part.startswith(prefix):
                named[prefix] = set(part[len(prefix) :].split(", "))
    for pid in named.get(NUMBERS, set()):
        assert training_log.changes_numbers(pid), (pid, line)
    for pid in named.get(CRASHES, set()):
        assert not training_log.changes_numbers(pid), (pid, line)
    # the guard's mode: these scripts run GRPO without vLLM, so a guard that is on has nothing to check
    mode = os.environ.get("TRL_COMPAT_GUARD", "").strip().lower()
    if mode in ("strict", "1", "true", "yes", "on"):
        shown = "strict" if mode == "strict" else "on"
        assert f"off-policy guard: {shown}, nothing to check (this run uses no vLLM)" in parts, line
    else:
        assert "off-policy guard: off" in parts, line
    return set().union(*named.values())


def under_launcher(*cmd):
    return [sys.executable, "-m", "trl_compat", "run", "--", *cmd]


def assert_announced(ranks, lines, output):
    (result,) = ranks
    assert result["trl_compat_imported"] is True, result
    applied = set(result["applied"])
    assert applied, result  # this TRL has patches that apply (TRL 0.15.2: ten)
    assert len(lines) == 1, output[-6000:]
    assert fixes_named(lines[0]) == applied, (lines, applied)
    # and in the first logged metrics, for W&B / TensorBoard
    assert result["metrics"] == {training_log.METRIC_PREFIX + pid: 1 for pid in applied}, result


@pytest.mark.parametrize("logging_setup", ["none", "transformers", "basic"])
def test_line_under_the_launcher(model_dir, tmp_path, logging_setup):
    ranks, lines, output = run(
        under_launcher(sys.executable, SCRIPT, model_dir, str(tmp_path), "--logging", logging_setup), base_env()
    )
    assert_announced(ranks, lines, output)


@pytest.fixture
def switch_dir(tmp_path):
    """A directory with the wheel's switch files, for an editable install that has none in site-packages."""
    directory = tmp_path / "site"
    directory.mkdir()
    for name in ("trl_compat.pth", "_trl_compat_auto.py"):
        shutil.copy(os.path.join(SITE_FILES, name), directory / name)
    return str(directory)


def with_switch(switch_dir, *script):
    """Python running ``script`` after ``site.addsitedir`` has processed the switch's .pth, as
    site-packages' is at start-up (the installed one, where the wheel put it, works the same)."""
    if activation.installed_site_files():
        return [sys.executable, *script]
    boot = textwrap.dedent("""
        import runpy, site, sys
        site.addsitedir(sys.argv[1])
        sys.argv = sys.argv[2:]
        runpy.run_path(sys.argv[0], run_name="__main__")
    """)
    return [sys.executable, "-c", boot, switch_dir, *script]


def test_line_under_the_switch(model_dir, tmp_path, switch_dir):
    ranks, lines, output = run(with_switch(switch_dir, SCRIPT, model_dir, str(tmp_path)), base_env(TRL_COMPAT_AUTO="1"))
    assert_announced(ranks, lines, output)


def test_quiet_silences_the_line_not_the_metrics(model_dir, tmp_path, switch_dir):
    ranks, lines, output = run(under_launcher(sys.executable, SCRIPT, model_dir, str(tmp_path)), base_env(TRL_COMPAT_QUIET="1"))
    assert lines == [] and "trl_compat " + trl_compat.__version__ + ":" not in output, output[-6000:]
    (result,) = ranks
    assert result["applied"] and result["metrics"] == {training_log.METRIC_PREFIX + p: 1 for p in result["applied"]}
    ranks, lines, output = run(
        with_switch(switch_dir, SCRIPT, model_dir, str(tmp_path / "switch")), base_env(TRL_COMPAT_AUTO="1", TRL_COMPAT_QUIET="yes")
    )
    assert lines == [] and ranks[0]["applied"], output[-3000:]


def test_line_once_in_a_two_process_launch(model_dir, tmp_path):
    cmd = under_launcher(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", SCRIPT, model_dir, str(tmp_path)
    )
    out = subprocess.run(
        cmd, env=base_env(DS_ACCELERATOR="cpu"), cwd=SUPPORT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=480
    )
    assert out.returncode == 0, out.stdout[-6000:]
    # from the ranks' files: their prints share one stdout and may interleave
    ranks = sorted((json.loads(path.read_text()) for path in tmp_path.glob("tlog-rank*.json")), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1], out.stdout[-6000:]
    lines = [line for line in out.stdout.splitlines() if LINE_START in line]
    assert len(lines) == 1, out.stdout[-6000:]  # the main process only
    for result in ranks:
        assert fixes_named(lines[0][lines[0].index(LINE_START) :]) == set(result["applied"]), (lines, result)
        assert set(result["metrics"]) == {training_log.METRIC_PREFIX + p for p in result["applied"]}, result


STRICT_SCRIPT = """
import sys
import trl_compat
from trl_compat import Patch, register, install

def probe(module):
    raise ValueError("the probe exploded")

register(Patch(id="test-strict-probe", summary="s", upstream="u", trigger="trl.trainer.grpo_trainer",
               must_exist="GRPOTrainer", changes=("GRPOTrainer",), requires={}, probe=probe, apply=lambda m, p: None))
install("test-strict-probe")
from trl import GRPOTrainer  # TRL's lazy module imports trl.trainer.grpo_trainer here: no error yet
print("IMPORTED", flush=True)
import grpo_run
grpo_run.make_trainer(sys.argv[1], model=sys.argv[2], steps=1)
"""


def test_strict_failure_is_trl_compats_own_error(model_dir, tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", STRICT_SCRIPT, str(tmp_path), model_dir],
        env=base_env(TRL_COMPAT_STRICT="1"),
        cwd=SUPPORT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode != 0 and "IMPORTED" in out.stdout, out.stdout + out.stderr[-4000:]
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "trl_compat.TrlCompatError: TRL_COMPAT_STRICT=1: test-strict-probe: failed: probe raised ValueError: the probe exploded"
    ), out.stderr[-4000:]
    assert "Failed to import" not in out.stderr, out.stderr[-4000:]


def test_the_callback_is_in_transformers_defaults_until_revert():
    import transformers.trainer
    import trl.trainer.grpo_trainer  # noqa: F401 - its import adds the callback

    callback = training_log.callback_class()
    assert callback in transformers.trainer.DEFAULT_CALLBACKS
    try:
        trl_compat.revert()
        assert callback not in transformers.trainer.DEFAULT_CALLBACKS
    finally:
        trl_compat.install()
    assert transformers.trainer.DEFAULT_CALLBACKS.count(callback) == 1
