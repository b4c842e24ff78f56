"""Zero-code activation (issue #12): ``trl-compat run`` and ``TRL_COMPAT_AUTO=1``, in real processes.

Every cell (a few seconds): the launcher's environment, its ``sitecustomize`` chaining to the
user's own, a ``multiprocessing`` spawn child inheriting the activation, no heavy import at
start-up, the switch on / off / broken, ``python -S``/``-I``/``-E``, and the report.

One cell (trl 0.15.2 x transformers 4.48.3, with deepspeed and accelerate; about 3 minutes on
2 cores): real 2-rank GRPO runs of ``tests/support/grpo_script.py``, which never imports trl_compat,

* ``trl-compat run -- accelerate launch`` with DeepSpeed ZeRO-3: every rank has trl_compat from
  start-up, the cell's patches applied, finite losses, and no ZeRO-3 hook on the engine while
  GRPO generates (``zero3-unwrap``); the same launch without ``trl-compat run``: trl_compat never
  imported, every hook on during generation (TRL 0.15's early return);
* ``trl-compat run -- torchrun`` and ``TRL_COMPAT_AUTO=1 torchrun`` (DDP, gloo);
* ``trl-compat run -- trl grpo`` (TRL's CLI) on a local tiny model, reward model and dataset
  directory;
* the wheel built from this tree, installed into a fresh venv: the switch works there.

The switch tests need the wheel's ``trl_compat.pth`` in this interpreter's site-packages, which
tox's ``package = wheel`` installs; they skip in a source-tree or editable install.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import venv
import zipfile

import trl_compat
from trl_compat import activation
from trl_compat.activation import launcher

import pytest

from cells import engine_cells
from expected_status import APPLIED, OPT_IN
from versions import installed
from workers import SUPPORT

ROOT = os.path.dirname(os.path.dirname(SUPPORT))
PROBE = os.path.join(SUPPORT, "activation_probe.py")
GRPO_SCRIPT = os.path.join(SUPPORT, "grpo_script.py")
USER_SITECUSTOMIZE = os.path.join(SUPPORT, "user_sitecustomize")
BIN = os.path.dirname(sys.executable)

PTH_INSTALLED = bool(activation.installed_site_files())
needs_pth = pytest.mark.skipif(
    not PTH_INSTALLED,
    reason="trl_compat.pth is not in this interpreter's site-packages (a source-tree or editable install); "
    "tox installs the wheel, which has it",
)

TRL, TF, DS, ACC = installed("trl"), installed("transformers"), installed("deepspeed"), installed("accelerate")
HEAVY_CELL = TRL is not None and str(TRL) == "0.15.2" and TF is not None and str(TF) == "4.48.3" and DS is not None and ACC is not None
heavy = pytest.mark.skipif(
    not HEAVY_CELL,
    reason="real multi-process launches run in one cell only (trl 0.15.2 x transformers 4.48.3 with deepspeed "
    "and accelerate), to keep the matrix fast",
)
HEAVY_APPLIED = APPLIED["trl0.15.2-tf4.48.3"]


def base_env(**extra):
    """This environment without either mechanism, this venv's scripts first on PATH."""
    env = dict(os.environ)
    for name in (activation.SWITCH, "PYTHONPATH", "TRL_COMPAT_TEST_REPORT_DIR", "TRL_COMPAT_TEST_SITECUSTOMIZE"):
        env.pop(name, None)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")
    env.update(extra)
    return env


def trl_compat_run(*command):
    return [sys.executable, "-m", "trl_compat", "run", "--", *command]


def probe(cmd, env, timeout=300):
    out = subprocess.run(cmd, env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("PROBE|")]
    assert len(lines) == 1, out.stdout + out.stderr
    return json.loads(lines[0][len("PROBE|") :]), out.stderr


def assert_active(facts, how):
    assert facts["trl_compat"] is True, facts
    assert facts["how"] == how, facts
    # Start-up imports trl_compat only: its patches wait on post-import hooks.
    assert facts["heavy"] == [], facts
    assert not any(st == trl_compat.APPLIED for st in facts["statuses"].values()), facts


# -- the launcher ---------------------------------------------------------------------------------


def test_child_environment_puts_the_bootstrap_first_and_keeps_pythonpath():
    boot, sep = activation.BOOTSTRAP_DIR, os.pathsep
    assert launcher.child_environment({})["PYTHONPATH"] == boot
    assert launcher.child_environment({"PYTHONPATH": ""})["PYTHONPATH"] == boot  # no "" entry (= the cwd) added
    user = sep.join(["/a", "", "/b"])  # the empty entry (the cwd) is the user's: kept
    assert launcher.child_environment({"PYTHONPATH": user})["PYTHONPATH"] == sep.join([boot, "/a", "", "/b"])
    # Nested `trl-compat run`: one entry, moved to the front.
    nested = launcher.child_environment({"PYTHONPATH": sep.join(["/a", boot, "/b"]), "X": "1"})
    assert nested == {"PYTHONPATH": sep.join([boot, "/a", "/b"]), "X": "1"}
    assert os.path.isfile(os.path.join(boot, "sitecustomize.py"))


def test_launcher_chains_the_users_sitecustomize_and_a_spawned_child_inherits():
    env = base_env(PYTHONPATH=USER_SITECUSTOMIZE)
    facts, stderr = probe(trl_compat_run(sys.executable, PROBE, "--spawn"), env)
    for who in ("main", "spawned"):
        assert_active(facts[who], activation.LAUNCHER)
        assert facts[who]["marker"] == "ran", facts[who]  # the user's sitecustomize ran too
        assert facts[who]["sitecustomize"] == os.path.join(USER_SITECUSTOMIZE, "sitecustomize.py"), facts[who]
        # Kept for children, the user's entry intact behind it. (The bootstrap of the trl_compat
        # those processes import: with `python -m pytest` in the source tree, not this one's.)
        boot, user = facts[who]["pythonpath"].split(os.pathsep)
        assert user == USER_SITECUSTOMIZE, facts[who]
        assert boot == os.path.join(os.path.dirname(facts[who]["file"]), "activation", "bootstrap"), facts[who]
    assert facts["spawned"]["pid"] != facts["main"]["pid"] and facts["spawn_exitcode"] == 0
    assert "trl_compat" not in stderr, stderr


def test_without_launcher_or_switch_nothing_is_imported():
    facts, _ = probe([sys.executable, PROBE, "--spawn"], base_env())
    for who in ("main", "spawned"):
        assert facts[who]["trl_compat"] is False, facts[who]
        assert facts[who]["marker"] is None and facts[who]["pythonpath"] is None, facts[who]


def test_console_script_and_errors():
    script = shutil.which("trl-compat", path=BIN)
    if script is None:
        pytest.skip("the trl-compat console script is not installed next to this interpreter")
    facts, _ = probe([script, "run", sys.executable, PROBE], base_env())  # `--` is optional
    assert_active(facts["main"], activation.LAUNCHER)
    missing = subprocess.run([script, "run", "--", "no-such-command-trl-compat"], capture_output=True, text=True)
    assert missing.returncode == 127 and "cannot run 'no-such-command-trl-compat'" in missing.stderr
    empty = subprocess.run([script, "run", "--"], capture_output=True, text=True)
    assert empty.returncode == 2 and "no command given" in empty.stderr


@pytest.mark.parametrize("flag", ["-E", "-I"])
def test_launcher_does_not_reach_python_started_with_E_or_I(flag):
    """Unsupported, documented: -E and -I ignore PYTHONPATH, so the bootstrap is never found."""
    facts, _ = probe(trl_compat_run(sys.executable, flag, PROBE), base_env())
    assert facts["main"]["trl_compat"] is False, facts


# -- the switch -----------------------------------------------------------------------------------


def test_switch_values():
    for value in ("1", "true", " ON ", "Yes"):
        assert activation.switch_on({activation.SWITCH: value})
    for value in ("", "0", "false", "off", "no", "2"):
        assert not activation.switch_on({activation.SWITCH: value})
    assert not activation.switch_on({})


@needs_pth
def test_switch_activates_every_process_and_only_when_on():
    facts, stderr = probe([sys.executable, PROBE, "--spawn"], base_env(TRL_COMPAT_AUTO="1"))
    for who in ("main", "spawned"):
        assert_active(facts[who], activation.SWITCHED)
        assert facts[who]["pythonpath"] is None  # no launcher involved
    assert stderr == "", stderr
    off, _ = probe([sys.executable, PROBE], base_env(TRL_COMPAT_AUTO="0"))
    assert off["main"]["trl_compat"] is False, off


def explicit_statuses():
    """The statuses right after a plain ``import trl_compat`` in this environment."""
    out = subprocess.run(
        [sys.executable, "-c", "import json, trl_compat; print(json.dumps({p.id: p.status for p in trl_compat.report()}))"],
        env=base_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


@needs_pth
def test_switch_statuses_equal_those_of_an_explicit_import():
    """The switch imports trl_compat after site has put every directory on sys.path, so its
    version gate decides as an import in the script would."""
    facts, _ = probe([sys.executable, PROBE], base_env(TRL_COMPAT_AUTO="1"))
    assert facts["main"]["statuses"] == explicit_statuses()


@needs_pth
def test_switch_on_with_a_broken_trl_compat_never_breaks_the_interpreter(tmp_path):
    broken = tmp_path / "trl_compat"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise RuntimeError('broken on purpose')\n")
    env = base_env(TRL_COMPAT_AUTO="1", PYTHONPATH=str(tmp_path))  # shadows the installed trl_compat
    out = subprocess.run([sys.executable, "-c", "print('alive')"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout == "alive\n", out
    assert "could not import trl_compat (RuntimeError: broken on purpose)" in out.stderr, out.stderr
    assert len(out.stderr.splitlines()) == 1, out.stderr  # one line, no traceback
    pip = subprocess.run([sys.executable, "-m", "pip", "--version"], env=env, capture_output=True, text=True, timeout=120)
    assert pip.returncode == 0 and pip.stdout.startswith("pip "), pip


@needs_pth
def test_switch_with_python_S_I_and_E():
    """-S: no site, no .pth: unsupported (documented). -I and -E still read site-packages' .pth
    files (they drop PYTHONPATH and other PYTHON* variables, not TRL_COMPAT_AUTO), so the switch
    works there."""
    env = base_env(TRL_COMPAT_AUTO="1")
    no_site, _ = probe([sys.executable, "-S", PROBE], env)
    assert no_site["main"]["trl_compat"] is False, no_site
    for flag in ("-I", "-E"):
        facts, _ = probe([sys.executable, flag, PROBE], env)
        assert_active(facts["main"], activation.SWITCHED)


# -- the report -----------------------------------------------------------------------------------


def test_describe_names_the_mechanism():
    launcher_env = {"PYTHONPATH": os.pathsep.join(["/x", activation.BOOTSTRAP_DIR])}
    described = activation.describe(launcher_env)
    assert described["automatic"] is True and described["mechanisms"] == [activation.LAUNCHER], described
    assert described["summary"].startswith("automatic: started under `trl-compat run`"), described

    switched = activation.describe({activation.SWITCH: "1"})
    if PTH_INSTALLED:
        assert switched["mechanisms"] == [activation.SWITCHED] and switched["switch"]["pth"], switched
        assert switched["summary"].startswith("automatic: TRL_COMPAT_AUTO=1 with "), switched
    else:
        assert switched["automatic"] is False and "editable or --target install" in switched["summary"], switched

    neither = activation.describe({})
    assert neither["automatic"] is False and neither["mechanisms"] == [], neither
    assert neither["summary"].startswith("not automatic: only scripts that `import trl_compat`"), neither
    assert neither["this_process"] == activation.IMPORTED  # pytest imported it


@engine_cells
def test_report_says_how_in_json_and_text():
    # TRL_COMPAT_DISABLE=*: nothing pending, so the report imports no trigger module (fast everywhere).
    env = base_env(TRL_COMPAT_DISABLE="*")
    out = subprocess.run(
        trl_compat_run(sys.executable, "-m", "trl_compat", "--json"), env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert list(data) == ["trl_compat", "headline", "counts", "trl", "versions", "settings", "activation", "guard", "patches"]
    assert data["activation"]["mechanisms"] == [activation.LAUNCHER], data["activation"]
    assert data["activation"]["this_process"] == activation.LAUNCHER
    text = subprocess.run([sys.executable, "-m", "trl_compat"], env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stderr
    line = [row for row in text.stdout.splitlines() if row.strip().startswith("activation")]
    assert len(line) == 1 and "not automatic" in line[0] and "(this process: by its own import)" in line[0], text.stdout


# -- the wheel ------------------------------------------------------------------------------------


@pytest.mark.skipif(not (HEAVY_CELL or TRL is None), reason="builds a wheel: runs in the notrl cell and one trl cell")
def test_wheel_carries_the_site_files_and_the_switch_works_in_a_fresh_venv(tmp_path):
    pytest.importorskip("setuptools", minversion="61", reason="building the wheel needs setuptools >= 61 here")
    src = tmp_path / "src"  # a copy: cells building in the same tree at once would share build/
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(".tox", ".git", "build", "dist", "*.egg-info", "__pycache__", "matrix", "benchmarks", "tests"),
    )
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "dist")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = glob.glob(str(tmp_path / "dist" / "trl_compat-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {
        "trl_compat.pth",
        "trl_compat.start",
        "_trl_compat_auto.py",
        "trl_compat/activation/bootstrap/sitecustomize.py",
    } <= names, sorted(names)

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = str(env_dir / "bin" / "python")
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True
    ).stdout.strip()
    assert os.path.isfile(os.path.join(purelib, "trl_compat.pth"))
    # trl_compat's dependencies (and trl, where installed) come from this cell's site-packages, added by
    # a .pth that sorts *after* trl_compat.pth: the switch must wait for it before importing trl_compat.
    with open(os.path.join(purelib, "zz_cell_site_packages.pth"), "w") as fh:
        fh.write(sysconfig.get_paths()["purelib"] + "\n")

    facts, _ = probe([python, PROBE], base_env(TRL_COMPAT_AUTO="1"))
    assert_active(facts["main"], activation.SWITCHED)
    assert facts["main"]["file"].startswith(purelib), facts  # the fresh venv's copy
    assert facts["main"]["statuses"] == explicit_statuses()  # the gate saw this cell's trl there too
    off, _ = probe([python, PROBE], base_env())
    assert off["main"]["trl_compat"] is False, off
    # Python >= 3.15 (PEP 829) calls trl_compat.start's entry point instead of the .pth's import line.
    with open(os.path.join(purelib, "trl_compat.start")) as fh:
        entry = fh.read().strip()
    call = f"import pkgutil, sys; pkgutil.resolve_name({entry!r})(); print('trl_compat' in sys.modules)"
    for value, expected in (("1", "True"), ("", "False")):
        out = subprocess.run(
            [
                python,
                "-S",
                "-c",
                "import site, sys; sys.path.append({!r}); sys.path.append({!r}); {}".format(
                    purelib, sysconfig.get_paths()["purelib"], call
                ),
            ],
            env=base_env(TRL_COMPAT_AUTO=value),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and out.stdout.strip() == expected, (value, out)


# -- real GRPO launches (one cell) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("activation") / "tiny_qwen2", "qwen2")


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def grpo_env(tmp_path, **extra):
    return base_env(
        TRL_COMPAT_STRICT="1",
        OMP_NUM_THREADS="1",
        CUDA_VISIBLE_DEVICES="",
        DS_ACCELERATOR="cpu",
        PYTHONUNBUFFERED="1",
        HF_HOME=str(tmp_path / "hf_home"),  # no accelerate config of this machine's user
        **extra,
    )


def accelerate_launch(*script):
    return [
        "accelerate",
        "launch",
        "--multi_gpu",
        "--num_processes",
        "2",
        "--num_machines",
        "1",
        "--mixed_precision",
        "no",
        "--dynamo_backend",
        "no",
        "--main_process_port",
        str(free_port()),
        *script,
    ]


def torchrun(*script):
    return ["torchrun", "--standalone", "--nproc_per_node", "2", *script]


def run_ranks(cmd, env, out_dir, log):
    with open(log, "w") as fh:
        proc = subprocess.run(cmd, env=env, cwd=SUPPORT, stdout=fh, stderr=subprocess.STDOUT, timeout=600)
    with open(log) as fh:
        tail = fh.read()[-6000:]
    assert proc.returncode == 0, tail
    ranks = []
    for rank in (0, 1):
        path = os.path.join(out_dir, f"rank{rank}.json")
        assert os.path.isfile(path), tail
        with open(path) as fh:
            ranks.append(json.load(fh))
    return ranks


def assert_patched(result, how):
    assert result["world_size"] == 2 and result["finite"] and len(result["losses"]) == 2, result
    assert result["trl_compat_at_start"] is True and result["how"] == how, result
    applied = {pid for pid, st in result["statuses"].items() if st == trl_compat.APPLIED}
    assert applied == HEAVY_APPLIED, result["statuses"]
    others = {pid: st for pid, st in result["statuses"].items() if pid not in OPT_IN["trl0.15.2-tf4.48.3"]}
    assert set(others.values()) <= {trl_compat.APPLIED, trl_compat.NOT_NEEDED}, result["statuses"]
    # opt-in patches whose bug is in this cell stay off: "disabled"
    assert {result["statuses"][pid] for pid in OPT_IN["trl0.15.2-tf4.48.3"]} == {trl_compat.DISABLED}


@heavy
@pytest.mark.parametrize("mode", ["trl-compat run", "neither"])
def test_accelerate_launch_zero3(mode, model_dir, tmp_path):
    out = tmp_path / "out"
    cmd = accelerate_launch(GRPO_SCRIPT, model_dir, str(out), "--zero3")
    ranks = run_ranks(trl_compat_run(*cmd) if mode == "trl-compat run" else cmd, grpo_env(tmp_path), out, tmp_path / "log.txt")
    for result in ranks:
        assert result["distributed_type"] == "DistributedType.DEEPSPEED", result
        baseline, during = result["hooks_baseline"], result["hooks_during_generation"]
        assert baseline > 0 and len(during) == 2, result  # 2 steps, one generation each
        if mode == "trl-compat run":
            assert_patched(result, activation.LAUNCHER)
            assert during == [0, 0], result  # zero3-unwrap: generation on gathered weights, no hook
        else:
            assert result["trl_compat_imported"] is False and result["finite"], result
            assert during == [baseline, baseline], result  # TRL 0.15.2's own: every hook on while generating


@heavy
@pytest.mark.parametrize("mode", ["trl-compat run", "TRL_COMPAT_AUTO=1"])
def test_torchrun_ddp(mode, model_dir, tmp_path):
    if mode == "TRL_COMPAT_AUTO=1" and not PTH_INSTALLED:
        pytest.skip("trl_compat.pth is not installed here (source-tree or editable install)")
    out = tmp_path / "out"
    cmd = torchrun(GRPO_SCRIPT, model_dir, str(out))
    if mode == "trl-compat run":
        ranks = run_ranks(trl_compat_run(*cmd), grpo_env(tmp_path), out, tmp_path / "log.txt")
    else:
        ranks = run_ranks(cmd, grpo_env(tmp_path, TRL_COMPAT_AUTO="1"), out, tmp_path / "log.txt")
    for result in ranks:
        assert result["distributed_type"] == "DistributedType.MULTI_CPU", result
        assert_patched(result, activation.LAUNCHER if mode == "trl-compat run" else activation.SWITCHED)


@heavy
def test_trl_grpo_cli_under_launcher(model_dir, tmp_path):
    """TRL 0.15's ``trl grpo`` runs its own scripts/grpo.py through accelerate's launcher. That
    script takes a reward *model* and ``load_dataset(dataset_name)``: a local directory with a
    ``train.jsonl`` needs no Hub."""
    import torch
    from transformers import Qwen2ForSequenceClassification

    import tiny

    torch.manual_seed(0)
    reward_dir = tiny.save_tiny(tmp_path / "reward", model=Qwen2ForSequenceClassification(tiny.model_config("qwen2", num_labels=1)))
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with open(data_dir / "train.jsonl", "w") as fh:
        for prompt in tiny.prompt_dataset(8)["prompt"]:
            fh.write(json.dumps({"prompt": prompt}) + "\n")
    reports = tmp_path / "reports"
    reports.mkdir()
    env = grpo_env(tmp_path, PYTHONPATH=USER_SITECUSTOMIZE, TRL_COMPAT_TEST_REPORT_DIR=str(reports))
    cmd = trl_compat_run(
        "trl",
        "grpo",
        "--model_name_or_path",
        model_dir,
        "--reward_model_name_or_path",
        reward_dir,
        "--dataset_name",
        str(data_dir),
        "--output_dir",
        str(tmp_path / "out"),
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "2",
        "--max_prompt_length",
        "16",
        "--max_completion_length",
        "8",
        "--report_to",
        "none",
        "--save_strategy",
        "no",
        "--logging_steps",
        "1",
        "--disable_tqdm",
        "True",
        "--learning_rate",
        "1e-3",
        "--seed",
        "0",
        "--bf16",
        "False",
    )
    proc = subprocess.run(cmd, env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    losses = [line for line in proc.stdout.splitlines() if line.startswith("{'loss': ")]
    assert len(losses) == 2, proc.stdout[-4000:]
    found = []
    for path in glob.glob(str(reports / "*.json")):
        with open(path) as fh:
            found.append(json.load(fh))
    training = [r for r in found if r["argv"][0].endswith(os.path.join("trl", "scripts", "grpo.py"))]
    assert len(training) == 1, found  # the process accelerate's launcher started for TRL's script
    (result,) = training
    assert result["trl_compat"] is True and result["how"] == activation.LAUNCHER, result
    applied = {pid for pid, st in result["statuses"].items() if st == trl_compat.APPLIED}
    assert applied == HEAVY_APPLIED, result
    cli = [r for r in found if os.path.basename(r["argv"][0]) == "trl"]
    assert len(cli) == 1 and cli[0]["how"] == activation.LAUNCHER, found  # the `trl` CLI process too
