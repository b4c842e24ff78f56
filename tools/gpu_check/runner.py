"""The GPU suite on a lent machine, from the wheels make_wheels.sh built (matrix/README.md, "On a GPU").

    python tools/gpu_check/runner.py [--cpu-dry-run] [--stacks trl1.9.2,...] [--parts suite,bench]

The machine has no network: its image's torch (CUDA), transformers 5.x, peft and accelerate are used
as they are; each TRL release is a pip --target site of build/gpu-wheels laid over them by PYTHONPATH.
suite: tests/gpu under each site (TRL 0.22.1, 0.24.0, 1.9.2, 1.16.0), in parallel.
bench: logits-to-keep at Qwen2.5-0.5B's shape (TRL 0.15.2 on transformers 4.48.3: unpatched and
       patched; on 4.50.3: native), one process at a time; written as benchmarks/logits_to_keep_gpu.md.
Results under $OUT (default ./gpu-out): summary.txt, junit-<stack>.xml, grpo/*.jsonl, bench.jsonl,
benchmarks/logits_to_keep_gpu.md, log.txt. Without CUDA it writes that it skipped and exits 0;
--cpu-dry-run runs the same on the CPU in float32 (small benchmark shape). Standard library only.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SUITE_STACKS = ("trl0.22.1", "trl0.24.0", "trl1.9.2", "trl1.16.0")
BENCH = (("unpatched", "bench_tf4.48.3"), ("patched", "bench_tf4.48.3"), ("native", "bench_tf4.50.3"))
IMAGE = ("torch", "transformers", "peft", "accelerate", "pyarrow", "pandas", "numpy", "huggingface_hub", "tokenizers")


class Run:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = args.cpu_dry_run
        self.out = os.path.abspath(args.out)
        self.work = tempfile.mkdtemp(prefix="trl_compat_gpu_")
        self.start = time.time()
        os.makedirs(self.out, exist_ok=True)
        self.log_path = os.path.join(self.out, "log.txt")
        open(self.log_path, "w").close()

    def log(self, text: str) -> None:
        print(text, flush=True)
        with open(self.log_path, "a") as handle:
            handle.write(text + "\n")

    def python(self, code: str, env: dict | None = None) -> str:
        done = subprocess.run([self.args.python, "-c", code], capture_output=True, text=True, env=env, timeout=300)
        return (done.stdout + done.stderr).strip()

    def env(self, site: str, **extra: str) -> dict:
        env = dict(os.environ)
        for name in ("TRL_COMPAT_DISABLE", "TRL_COMPAT_AUTO", "TRL_COMPAT_ONLY", "TRL_COMPAT_STRICT", "TRL_COMPAT_GUARD"):
            env.pop(name, None)
        env.update(
            PYTHONPATH=os.pathsep.join([os.path.join(self.work, "sites", site)] + [p for p in [env.get("PYTHONPATH")] if p]),
            PYTHONNOUSERSITE="1", PYTHONUNBUFFERED="1", HF_HOME=os.path.join(self.work, "hf_home"),
            HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
            WANDB_DISABLED="true", WANDB_MODE="disabled",
        )  # fmt: skip
        if self.dry:
            env["TRL_COMPAT_GPU_DRY_RUN"] = "1"
        env.update(extra)
        return env

    def install(self, site: str, folders: tuple[str, ...]) -> bool:
        tag = "py" + self.python("import sys; print('%d%d' % sys.version_info[:2])")
        files = []
        for folder in folders:
            path = os.path.join(self.args.wheels, folder)
            for name in sorted(os.listdir(path)) if os.path.isdir(path) else []:
                per_python = re.search(r"-(py3\d+)-none-any\.whl$", name)
                if name.endswith(".whl") and (per_python is None or per_python.group(1) == tag):
                    files.append(os.path.join(path, name))
        command = [self.args.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--disable-pip-version-check", "--target", os.path.join(self.work, "sites", site)] + files  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True)
        self.log(f"[site] {site}: {len(files)} wheels, rc={done.returncode} {done.stderr.strip()[-300:] if done.returncode else ''}")
        return done.returncode == 0 and bool(files)

    # -- the suite ---------------------------------------------------------------------------
    def suite(self, stacks: list[str]) -> dict:
        def one(stack: str) -> tuple[str, dict]:
            if not self.install(stack, ("suite_common", stack, "trl_compat")):
                return stack, {"error": "site not installed"}
            junit = os.path.join(self.out, f"junit-{stack}.xml")
            env = self.env(stack, TRL_COMPAT_GPU_OUT=os.path.join(self.out, "grpo"), TRL_COMPAT_GPU_STACK=stack,
                           OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")  # fmt: skip
            command = [self.args.python, "-m", "pytest", "tests/gpu", "-q", "-p", "no:cacheprovider", "-rfEs", f"--junitxml={junit}"]
            started = time.time()
            with open(os.path.join(self.out, f"pytest-{stack}.txt"), "w") as handle:
                try:
                    rc = subprocess.run(
                        command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, timeout=self.args.stack_timeout
                    ).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            counts = junit_counts(junit)
            counts.update(rc=rc, seconds=round(time.time() - started))
            self.log(f"[suite] {stack}: {counts}")
            return stack, counts

        parallel = 1 if self.dry else len(stacks)
        with cf.ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
            return dict(pool.map(one, stacks))

    # -- the benchmark -----------------------------------------------------------------------
    def bench(self) -> list[dict]:
        rows: list[dict] = []
        save = os.path.join(self.work, "logps")
        os.makedirs(save, exist_ok=True)
        script = os.path.join(HERE, "logits_to_keep.py")
        installed = {site: self.install(site, ("bench_common", site, "trl_compat")) for site in {s for _, s in BENCH}}
        for mode, site in BENCH:
            if not installed[site]:
                rows.append(dict(part="B", mode=mode, ok=False, err="site not installed"))
                continue
            extra = {"OMP_NUM_THREADS": "1" if self.dry else "8"}
            if mode == "patched":
                extra["TRL_COMPAT_STRICT"] = "1"
            rows += self.json_lines([self.args.python, script, "--mode", mode, "--save", save], self.env(site, **extra), mode)
        rows += self.json_lines([self.args.python, script, "--compare", save], self.env("bench_tf4.48.3"), "compare")
        with open(os.path.join(self.out, "bench.jsonl"), "w") as handle:
            handle.writelines(json.dumps(row, default=str) + "\n" for row in rows)
        os.makedirs(os.path.join(self.out, "benchmarks"), exist_ok=True)
        with open(os.path.join(self.out, "benchmarks", "logits_to_keep_gpu.md"), "w") as handle:
            handle.write(bench_markdown(rows, self.dry))
        return rows

    def json_lines(self, command: list[str], env: dict, name: str) -> list[dict]:
        try:
            done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=self.args.bench_timeout)
            stdout, stderr, rc = done.stdout, done.stderr, done.returncode
        except subprocess.TimeoutExpired as exc:
            stdout, stderr, rc = str(exc.stdout or ""), str(exc.stderr or ""), 124
        rows = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("@@JSON ")]
        self.log(
            f"[bench] {name}: rc={rc}, {len(rows)} row(s)"
            + ("" if rows and rc == 0 else "\n  " + "\n  ".join(stderr.splitlines()[-20:]))
        )
        return rows or [dict(part="B", mode=name, ok=False, err=f"no result (rc={rc})")]


def junit_counts(path: str) -> dict:
    try:
        suite = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return {"error": "no junit XML"}
    suite = suite.find("testsuite") if suite.tag == "testsuites" else suite
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    counts["failed_tests"] = [
        case.get("name") for case in suite.iter("testcase") if case.find("failure") is not None or case.find("error") is not None
    ]
    return counts


def bench_markdown(rows: list[dict], dry: bool) -> str:
    measured = [r for r in rows if r.get("mode") in ("unpatched", "patched", "native")]
    device = next((r.get("device") for r in measured if r.get("device")), "?")
    shape = next((r.get("shape") for r in measured if r.get("shape")), {})
    lines = [
        "# logits-to-keep on a GPU" + (" (CPU dry run: not a measurement)" if dry else ""),
        "",
        f"Device: {device}. TRL 0.15.2's `GRPOTrainer._get_per_token_logps`, bf16, a random-init Qwen2 of Qwen2.5-0.5B's shape "
        f"(batch {shape.get('batch')}, prompt {shape.get('prompt')}, completion {shape.get('completion')}); written by "
        "tools/gpu_check/runner.py. Peak: `torch.cuda.max_memory_allocated` above what the call started with; time: median.",
        "",
        "| variant | transformers | lm_head output | reference: peak MiB / s | policy (with backward): peak MiB / s |",
        "|---|---|---|---|---|",
    ]
    for r in measured:

        def cell(use: str, row: dict = r) -> str:
            part = row.get(use) or {}
            return "error: " + str(part["err"])[:80] if "err" in part else f"{part.get('peak_mib')} / {part.get('seconds')}"

        versions = r.get("versions") or {}
        head = (r.get("ref") or {}).get("lm_head_out", r.get("err", "?"))
        lines.append(f"| {r['mode']} | {versions.get('transformers', '?')} | {head} | {cell('ref')} | {cell('policy')} |")
    compared = [r for r in rows if r.get("mode") == "compare" and r.get("use") in ("ref", "policy")]
    if compared:
        lines += ["", "Log-prob agreement (max |difference|): " + "; ".join(
            f"{r['use']}: patched vs native {(r.get('patched_vs_native') or {}).get('max_abs')}" for r in compared)]  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu-dry-run", action="store_true", help="the same on the CPU in float32, small benchmark shape")
    parser.add_argument("--stacks", default=",".join(SUITE_STACKS))
    parser.add_argument("--parts", default="suite,bench")
    parser.add_argument("--out", default=os.environ.get("OUT") or os.path.join(ROOT, "gpu-out"))
    parser.add_argument("--wheels", default=os.path.join(ROOT, "build", "gpu-wheels"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--stack-timeout", type=float, default=420.0)
    parser.add_argument("--bench-timeout", type=float, default=150.0)
    args = parser.parse_args(argv)
    if args.cpu_dry_run:
        args.stack_timeout, args.bench_timeout = max(args.stack_timeout, 1800.0), max(args.bench_timeout, 900.0)
    run = Run(args)
    cuda = run.python("import torch; print(torch.cuda.is_available() and torch.cuda.get_device_name(0))")
    image = run.python(
        f"import importlib.metadata as m\nfor d in {IMAGE!r}:\n  try: print(d, m.version(d))\n  except Exception: print(d, 'MISSING')"
    )
    run.log(f"[runner] python {sys.version.split()[0]}; CUDA: {cuda}; image: {' '.join(image.split())}")
    summary: dict = {"device": cuda, "dry_run": args.cpu_dry_run, "image": image.splitlines()}
    if cuda.splitlines()[-1:] in (["False"], []) and not args.cpu_dry_run:
        summary["skipped"] = "no CUDA on this machine (--cpu-dry-run runs the suite on the CPU)"
    elif not os.path.isdir(args.wheels):
        summary["error"] = f"{os.path.relpath(args.wheels, ROOT)} missing: run tools/gpu_check/make_wheels.sh and carry it"
    else:
        parts = args.parts.split(",")
        if "suite" in parts:
            summary["suite"] = run.suite([s for s in args.stacks.split(",") if s])
        if "bench" in parts:
            summary["bench"] = [
                {k: r.get(k) for k in ("mode", "ok", "err", "device", "ref", "policy", "use", "patched_vs_native")}
                for r in run.bench()
            ]
    summary["seconds"] = round(time.time() - run.start)
    text = json.dumps(summary, indent=1, default=str)
    with open(os.path.join(run.out, "summary.txt"), "w") as handle:
        handle.write(text + "\n")
    run.log(text)
    shutil.rmtree(run.work, ignore_errors=True)
    failed = any(c.get("failures") or c.get("errors") or c.get("error") for c in summary.get("suite", {}).values())
    failed = failed or any(r.get("ok") is False for r in summary.get("bench", []))
    return 1 if failed or "error" in summary else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
