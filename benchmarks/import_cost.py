"""What ``import trl_compat`` costs, against starting Python, in an environment with TRL installed.

Run it with the Python of a matrix cell's venv where trl-compat is installed
(``pip install --no-deps .``), e.g. ``trl0.15.2-tf4.48.3``. It times, in rounds with the
variants in rotating order (so that the machine's load falls on all of them alike):

- **python -c pass**: the interpreter alone;
- **import trl_compat**: ``python -c "import trl_compat"`` (imports trl_compat, its engine's
  package and the post-import hooks, and watches for ``trl``: the registry, the settings and the
  gates load when TRL's import begins; no torch, transformers, trl or patch module), the installed
  copy (it runs in a temporary directory, not in this tree);
- **import trl_compat, then its registry**: the same, plus ``trl_compat.report()``: what TRL's
  import adds to the process at its start (the registry, the settings check, every patch gated);
- **TRL_COMPAT_AUTO=1**: ``python -c pass`` with the switch on, where the wheel's
  ``trl_compat.pth`` is installed (trl_compat imported at start-up by ``site``).

It reports the median CPU time (user + system, from ``wait4``) of each, its ratio to the
interpreter alone, and the number of modules each leaves in ``sys.modules``. Then, paired
(``--trainer-pairs``, alternating which runs first): ``from trl import GRPOTrainer`` against
``import trl_compat; from trl import GRPOTrainer``, the median of the per-pair CPU ratios: what
trl_compat adds to TRL's own import, where its registry, gates and trigger hooks run. Writes markdown::

    .venv/bin/python benchmarks/import_cost.py [--rounds 40] [--trainer-pairs 8] [--out benchmarks/import_cost.md]
"""

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile

import _measure

COUNT = "import sys; print(len(sys.modules))"
TARGET = 1.1  # issue #45 (#34: 1.2x, #11: 2x): import trl_compat within 1.1x the CPU time of `python -c pass`
TRAINER_TARGET = 0.02  # issue #45: `from trl import GRPOTrainer` at most 2 % slower with trl_compat imported first
TRAINER = "from trl import GRPOTrainer"
# Run away from any source tree: `python -c` puts the working directory first on sys.path
# (main() changes into it; the children inherit it).
CWD = tempfile.gettempdir()


def variants():
    env = _measure.child_env()
    found = [
        ("python -c pass", [sys.executable, "-c", "pass"], env),
        ("import trl_compat", [sys.executable, "-c", "import trl_compat"], env),
        ("import trl_compat, then its registry", [sys.executable, "-c", "import trl_compat; trl_compat.report()"], env),
    ]
    if os.path.exists(os.path.join(sysconfig.get_paths()["purelib"], "trl_compat.pth")):
        found.append(("TRL_COMPAT_AUTO=1, python -c pass", [sys.executable, "-c", "pass"], dict(env, TRL_COMPAT_AUTO="1")))
    return found


def trainer_pairs(pairs, env):
    """``(per-pair ratios, plain CPU ms, with-trl_compat CPU ms)`` of TRL's trainer import, alternating
    which of the two runs first in each pair."""
    plain = [sys.executable, "-c", TRAINER]
    compat = [sys.executable, "-c", "import trl_compat; " + TRAINER]
    for cmd in (plain, compat):  # warm the .pyc files of torch, transformers and TRL
        cpu_ms(cmd, env)
    ratios, plain_ms, compat_ms = [], [], []
    for i in range(pairs):
        order = (plain, compat) if i % 2 == 0 else (compat, plain)
        timed = {id(cmd): cpu_ms(cmd, env)[0] for cmd in order}
        plain_ms.append(timed[id(plain)])
        compat_ms.append(timed[id(compat)])
        ratios.append(compat_ms[-1] / plain_ms[-1])
    return ratios, plain_ms, compat_ms


def cpu_ms(cmd, env):
    """CPU time of one run, and its wall time, in ms."""
    wall, cpu = _measure.run_timed(cmd, env)
    return cpu * 1e3, wall * 1e3


def modules(cmd, env):
    code = cmd[-1] + "\n" + COUNT if cmd[-1] != "pass" else COUNT
    out = subprocess.run(cmd[:-1] + [code], env=env, capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def dist(name):
    out = subprocess.run(
        [sys.executable, "-c", f"import importlib.metadata as m; print(m.version({name!r}))"], capture_output=True, text=True
    )
    return out.stdout.strip() or "-"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--trainer-pairs", type=int, default=8, help="paired runs of TRL's trainer import (0: none)")
    parser.add_argument("--out", default="")
    parser.add_argument("--before", default="", help="a markdown file appended as is (an earlier run, for comparison)")
    args = parser.parse_args()
    out_path = os.path.abspath(args.out) if args.out else ""
    before_path = os.path.abspath(args.before) if args.before else ""
    os.chdir(CWD)
    runs = variants()
    for _, cmd, env in runs:  # warm the page cache and the .pyc files
        for _ in range(3):
            cpu_ms(cmd, env)
    cpu = {name: [] for name, _, _ in runs}
    wall = {name: [] for name, _, _ in runs}
    for i in range(args.rounds):
        for name, cmd, env in runs[i % len(runs) :] + runs[: i % len(runs)]:
            c, w = cpu_ms(cmd, env)
            cpu[name].append(c)
            wall[name].append(w)
    base = statistics.median(cpu[runs[0][0]])
    load = os.getloadavg()[0]
    lines = [
        "# What `import trl_compat` costs",
        "",
        f"`python benchmarks/import_cost.py --rounds {args.rounds}`, one run, "
        f"{datetime.date.today().isoformat()}, Python {platform.python_version()}, trl {dist('trl')}, "
        f"transformers {dist('transformers')}, trl-compat {dist('trl-compat')}; {os.cpu_count()} CPU cores, "
        f"load average {load:.1f} at the end (a shared machine: compare medians and quartiles, not single runs).",
        "",
        f"{args.rounds} rounds, variants in rotating order, after 3 warm-up runs each. CPU time is user + "
        "system of the process (from `wait4`); wall time mostly measures the wait for a core here.",
        "",
        "| variant | CPU median (ms) | CPU quartiles (ms) | ratio to `python -c pass` | wall median (ms) | modules in sys.modules |",
        "|---|---|---|---|---|---|",
    ]
    for name, cmd, env in runs:
        q = _measure.quartiles(cpu[name])
        lines.append(
            f"| {name} | {statistics.median(cpu[name]):.1f} | {q[0]:.1f} – {q[1]:.1f} | "
            f"{statistics.median(cpu[name]) / base:.2f} | {statistics.median(wall[name]):.1f} | "
            f"{modules(cmd, env)} |"
        )
    ratio = statistics.median(cpu["import trl_compat"]) / base
    lines += [
        "",
        f"`import trl_compat` / `python -c pass`, ratio of the CPU medians: {ratio:.2f}x "
        f"(target <= {TARGET}x): {'met' if ratio <= TARGET else 'NOT met'}.",
    ]
    if args.trainer_pairs:
        ratios, plain_ms, compat_ms = trainer_pairs(args.trainer_pairs, runs[0][2])
        added = statistics.median(ratios) - 1
        lines += [
            "",
            f"`{TRAINER}`, {args.trainer_pairs} pairs (alternating which runs first): CPU median "
            f"{statistics.median(plain_ms):.0f} ms plain, {statistics.median(compat_ms):.0f} ms with `import trl_compat` "
            f"first; median of the per-pair ratios {statistics.median(ratios):.3f} (quartiles "
            f"{_measure.quartiles(ratios)[0]:.3f} – {_measure.quartiles(ratios)[1]:.3f}): {added * 100:+.1f} % "
            f"(target <= +{TRAINER_TARGET * 100:.0f} %): {'met' if added <= TRAINER_TARGET else 'NOT met'}.",
        ]
    if before_path:
        with open(before_path) as fh:
            lines += ["", fh.read().rstrip()]
    text = "\n".join(lines) + "\n"
    print(text)
    if out_path:
        with open(out_path, "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
