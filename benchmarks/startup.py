"""Interpreter start-up with trl-compat installed: switch off, switch on, launcher, vs a venv without it.

Builds the wheel from this tree, makes two fresh venvs from the running interpreter, and
installs the wheel into one of them. Both get the same extra ``.pth`` path line naming the
running interpreter's site-packages (trl_compat's dependency, packaging, and
whatever else is installed there), so they differ only by trl-compat's files. Then times
``python -c pass`` in rounds, variants in rotating order:

- **without**: the venv without trl-compat;
- **installed, switch off**: the wheel's ``trl_compat.pth`` is read, ``TRL_COMPAT_AUTO`` unset;
- **switch on**: ``TRL_COMPAT_AUTO=1`` (trl_compat imported at start-up);
- **launcher**: ``trl-compat run``'s bootstrap directory on ``PYTHONPATH`` (its ``sitecustomize``
  imports trl_compat), timed without the launcher's own start-up.

Writes benchmarks/startup.md::

    tox -e bench-startup    or    python benchmarks/startup.py [--rounds 60] [--out benchmarks/startup.md]
"""

import argparse
import datetime
import glob
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import venv

import _measure

HERE = os.path.dirname(os.path.abspath(__file__))
# Cumulative import times shown for the switch-on start-up (nested ones are included in their parent's).
IMPORTS = ("trl_compat", "trl_compat._engine", "trl_compat.patches", "logging", "dataclasses", "inspect")
ROOT = os.path.dirname(HERE)


def venv_python(path):
    return os.path.join(path, "bin", "python")


def purelib_of(python):
    return subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], check=True, capture_output=True, text=True
    ).stdout.strip()


def make_venv(path, deps_dir, wheel=None):
    venv.create(path, with_pip=False)
    python = venv_python(path)
    if wheel:
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel], check=True
        )
    with open(os.path.join(purelib_of(python), "deps.pth"), "w") as fh:
        fh.write(deps_dir + "\n")
    return python


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--out", default=os.path.join(HERE, "startup.md"))
    args = parser.parse_args()

    deps_dir = sysconfig.get_paths()["purelib"]
    base_env = _measure.child_env()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", ROOT, "--no-deps", "--no-build-isolation", "-q", "-w", os.path.join(tmp, "dist")],
            check=True,
        )
        (wheel,) = glob.glob(os.path.join(tmp, "dist", "trl_compat-*.whl"))
        without = make_venv(os.path.join(tmp, "without"), deps_dir)
        with_it = make_venv(os.path.join(tmp, "with"), deps_dir, wheel)
        bootstrap = os.path.join(purelib_of(with_it), "trl_compat", "activation", "bootstrap")
        check = "import sys; print('trl_compat' in sys.modules)"
        variants = {
            "without": (without, base_env, "False"),
            "installed, switch off": (with_it, base_env, "False"),
            "switch on (TRL_COMPAT_AUTO=1)": (with_it, dict(base_env, TRL_COMPAT_AUTO="1"), "True"),
            "launcher (bootstrap on PYTHONPATH)": (with_it, dict(base_env, PYTHONPATH=bootstrap), "True"),
        }
        for name, (python, env, expected) in variants.items():
            got = subprocess.run([python, "-c", check], env=env, check=True, capture_output=True, text=True)
            assert got.stdout.strip() == expected, (name, got.stdout, got.stderr)
        names = list(variants)
        times = {name: [] for name in names}
        cpu = {name: [] for name in names}
        for name in names:  # warm-up: page cache, .pyc files
            for _ in range(3):
                _measure.run_timed([variants[name][0], "-c", "pass"], variants[name][1])
        for i in range(args.rounds):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                python, env, _ = variants[name]
                wall, used = _measure.run_timed([python, "-c", "pass"], env)
                times[name].append(wall)
                cpu[name].append(used)

        # Where the switch's time goes: -X importtime of the start-up with the switch on.
        parts = {}
        for _ in range(7):
            out = subprocess.run(
                [with_it, "-X", "importtime", "-c", "pass"], env=variants[names[2]][1], check=True, capture_output=True, text=True
            ).stderr
            for line in out.splitlines():
                fields = [f.strip() for f in line.split("|")]
                if len(fields) == 3 and fields[2].strip() in IMPORTS and fields[1].isdigit():
                    parts.setdefault(fields[2].strip(), []).append(int(fields[1]) / 1000)

    med = {name: statistics.median(t) for name, t in times.items()}
    med_cpu = {name: statistics.median(t) for name, t in cpu.items()}
    rows = []
    for name in names:
        lo, hi = _measure.quartiles(cpu[name])
        rows.append(
            f"| {name} | {med_cpu[name] * 1000:.1f} | {lo * 1000:.1f} – {hi * 1000:.1f} | "
            f"{med_cpu[name] / med_cpu['without']:.3f} | {(med_cpu[name] - med_cpu['without']) * 1000:+.1f} | "
            f"{med[name] * 1000:.1f} | {med[name] / med['without']:.3f} |"
        )
    table = "\n".join(rows)
    parts_table = "\n".join(f"| `{name}` | {statistics.median(parts[name]):.1f} |" for name in IMPORTS if name in parts)
    base, off, on = med_cpu["without"], med_cpu["installed, switch off"], med_cpu["switch on (TRL_COMPAT_AUTO=1)"]
    launch = med_cpu["launcher (bootstrap on PYTHONPATH)"]
    header = (
        "| variant | CPU median (ms) | CPU quartiles (ms) | CPU ratio to without | CPU difference (ms) "
        "| wall median (ms) | wall ratio |"
    )
    today = datetime.date.today().isoformat()
    report = f"""# Interpreter start-up with trl-compat installed

`tox -e bench-startup` (`python benchmarks/startup.py --rounds {args.rounds}`), one run, {today}.

Setup: two fresh venvs made from the running Python {platform.python_version()}, one with the
wheel built from this tree installed (`trl_compat.pth`, `trl_compat.start`, `_trl_compat_auto.py` at the
root of its site-packages); both with the same `deps.pth` naming the running interpreter's site-packages.
`python -c pass`, {args.rounds} rounds with the 4 variants in rotating order
after 3 warm-up runs each; {os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the end: a shared
machine, so the spread is wide).

CPU time (user + system, from `wait4`) of each `python -c pass` process, and its wall time, which on
a loaded machine mostly measures the wait for a core:

{header}
|---|---|---|---|---|---|---|
{table}

- **Switch off**: {off / base:.3f}x the CPU time of a start-up without trl-compat ({(off - base) * 1000:+.1f} ms;
  compare the quartiles): the `.pth` line costs one environment lookup (and `site` reads one more
  small file).
- **Switch on**: {(on - base) * 1000:+.1f} ms of CPU per interpreter for importing trl_compat (its modules and
  the patches', the version gate reading every patch's distributions' metadata, the post-import hooks); no torch,
  trl or deepspeed is imported at start-up.
- **Launcher**: {(launch - base) * 1000:+.1f} ms of CPU per interpreter: the same import, plus looking up a
  `sitecustomize` to chain to. `trl-compat run` itself adds one more interpreter start before the `exec`.

Cumulative import times with the switch on (`python -X importtime -c pass`, median of 7; nested
imports are included in their parent's; `trl_compat`'s own includes `install()`, the version gate):

| module | cumulative import (ms) |
|---|---|
{parts_table}

A GRPO process imports torch, transformers and trl afterwards, which takes seconds; these costs are
paid once per process.
"""
    with open(args.out, "w") as fh:
        fh.write(report)
    print(report)


if __name__ == "__main__":
    main()
