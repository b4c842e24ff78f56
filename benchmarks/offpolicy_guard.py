"""Benchmark: what the off-policy guard costs a GRPO step and a weight sync, and what trl_compat's
patches cost a step where no bug triggers.

* **guard per step**: the same GRPO run (vLLM colocate on the test stand-in, a Qwen2 built in code)
  with ``TRL_COMPAT_GUARD`` unset and ``=1``, in alternating fresh processes (the guard hooks an
  engine when it is built). Time per optimizer step: median over the steps after the first of each
  run, then the median over the rounds of the on/off ratio. Target: <= 2 % of a step where vLLM
  already returns log-probs (TRL >= 0.23 asks for them itself).
* **guard per sync**: in one process, the engine model's ``load_weights`` of the trainer's whole
  state dict through the guard's hook (W1's audit, C's bookkeeping) vs vLLM's own method on the
  same engine, interleaved.
* **asking for log-probs** (TRL < 0.23, where the guard adds ``logprobs=0`` for check L): one
  ``generate`` with and without it, interleaved. On the stand-in this measures the stand-in (it
  computes log-probs from Hugging Face's scores), not vLLM: the only figure for real vLLM is vLLM
  PR #57442's (0.947x tokens/s at concurrency 1 on a 0.5B model), quoted, not measured here.
* **trl_compat, guard off**: the same run with no vLLM, every patch on vs ``TRL_COMPAT_DISABLE='*'``,
  alternating fresh processes, in a cell where the applied patches find nothing to correct in this
  run. Target: <= 1 % of a step.

Run:  tox -e bench-offpolicy_guard    or    python benchmarks/offpolicy_guard.py --out benchmarks/offpolicy_guard.md
Needs the test stand-in of vLLM installed (a matrix cell's venv) and tests/support importable.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SUPPORT = os.path.join(ROOT, "tests", "support")
MODEL = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4)
BASE_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "PYTHONHASHSEED": "0",
}


def _trainer(tmp: str, use_vllm: bool, steps: int, completion: int):
    sys.path[:0] = [SUPPORT, ROOT]
    import grpo_run
    import tiny

    path = tiny.save_tiny(os.path.join(tmp, "model"), model=tiny.make_model("qwen2", seed=0, **MODEL))
    return grpo_run.make_trainer(tmp, model=path, use_vllm=use_vllm, steps=steps, max_completion_length=completion)


def _step_times(trainer) -> list:
    from transformers import TrainerCallback

    times, started = [], []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            started.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            times.append(time.perf_counter() - started[-1])

    trainer.add_callback(Clock())
    trainer.train()
    return times


def worker_steps(use_vllm: bool, steps: int, completion: int) -> dict:
    import trl_compat  # noqa: F401  (as a user's script does, before trl)
    from trl_compat import guard

    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(tmp, use_vllm, steps, completion)
        times = _step_times(trainer)
    return {"step_s": statistics.median(times[1:]), "guard": guard.mode(), "stats": guard.stats()}


def worker_sync(reps: int) -> dict:
    import trl_compat  # noqa: F401
    from trl_compat import guard

    assert guard.active(), "run with TRL_COMPAT_GUARD=1"
    with tempfile.TemporaryDirectory() as tmp:
        trainer = _trainer(tmp, True, 1, 8)
        trainer.train()  # one sync and one generation: the guard's calibration is done
        import grpo_run

        model = grpo_run.trainer_llm(trainer).llm_engine.model_executor.driver_worker.model_runner.model
        state = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
        guarded_call, plain_call = model.load_weights, lambda weights: type(model).load_weights(model, weights)
        on, off = [], []
        for _ in range(reps):
            for call, out in ((guarded_call, on), (plain_call, off)):
                start = time.perf_counter()
                call(state.items())
                out.append(time.perf_counter() - start)
        llm = grpo_run.trainer_llm(trainer)
        from vllm import SamplingParams

        prompts = ["zaza bebe coco"] * 8
        without, with_lp = [], []
        for _ in range(reps):
            plain, asking = SamplingParams(max_tokens=16, seed=1), SamplingParams(max_tokens=16, seed=1, logprobs=0)
            for params, out in ((plain, without), (asking, with_lp)):
                start = time.perf_counter()
                type(llm).generate(llm, prompts, params, use_tqdm=False)
                out.append(time.perf_counter() - start)
    return {
        "sync_on_s": statistics.median(on),
        "sync_off_s": statistics.median(off),
        "gen_s": statistics.median(without),
        "gen_logprobs_s": statistics.median(with_lp),
    }


def _run_worker(args: list, extra_env: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TRL_COMPAT_GUARD", "TRL_COMPAT_DISABLE")}
    env.update(BASE_ENV, **extra_env, PYTHONPATH=os.pathsep.join([ROOT, SUPPORT, env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, __file__, "--worker", *args], env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"worker {args} {extra_env} failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def paired(args: list, a_env: dict, b_env: dict, rounds: int) -> tuple:
    """Alternating fresh processes; returns (median a, median b, median of per-round b/a, raw rows)."""
    rows = []
    for index in range(rounds):
        order = [(a_env, "a"), (b_env, "b")] if index % 2 == 0 else [(b_env, "b"), (a_env, "a")]
        got = {label: _run_worker(args, env) for env, label in order}
        rows.append(got)
    a = statistics.median(r["a"]["step_s"] for r in rows)
    b = statistics.median(r["b"]["step_s"] for r in rows)
    ratio = statistics.median(r["b"]["step_s"] / r["a"]["step_s"] for r in rows)
    return a, b, ratio, rows


def versions() -> str:
    import importlib.metadata as md

    found = []
    for dist in ("torch", "transformers", "trl", "vllm"):
        try:
            found.append(f"{dist} {md.version(dist)}")
        except md.PackageNotFoundError:
            pass
    return ", ".join(found)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", nargs="*")
    parser.add_argument("--out")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--completion", type=int, default=32)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    if args.worker is not None:
        kind, *rest = args.worker
        if kind == "steps":
            result = worker_steps(rest[0] == "vllm", int(rest[1]), int(rest[2]))
        else:
            result = worker_sync(int(rest[0]))
        print(json.dumps(result))
        return 0

    started = time.time()
    load_before = os.getloadavg()[0]
    step_args = ["steps", "vllm", str(args.steps), str(args.completion)]
    off, on, guard_ratio, guard_rows = paired(step_args, {}, {"TRL_COMPAT_GUARD": "1"}, args.rounds)
    sync = _run_worker(["sync", str(args.reps)], {"TRL_COMPAT_GUARD": "1"})
    plain_args = ["steps", "novllm", str(args.steps), str(args.completion)]
    patched, disabled, patch_ratio, _ = paired(plain_args, {"TRL_COMPAT_DISABLE": "*"}, {}, args.rounds)
    stats = guard_rows[0]["b"]["stats"] if guard_rows[0]["b"]["guard"] != "off" else guard_rows[0]["a"]["stats"]
    lines = [
        "# The off-policy guard and trl_compat's patches: cost per GRPO step and per weight sync",
        "",
        f"Generated by `tox -e bench-offpolicy_guard` (`python benchmarks/offpolicy_guard.py --rounds {args.rounds} --steps "
        f"{args.steps} --completion {args.completion} --reps {args.reps}`) on {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, {versions()}; whole run {time.time() - started:.0f} s, "
        f"load average {load_before:.1f} before / {os.getloadavg()[0]:.1f} after. One thread per process. vLLM is the test stand-in.",
        "",
        f"Model: Qwen2 built in code ({MODEL['hidden_size']} hidden, {MODEL['num_hidden_layers']} layers), float32; "
        f"{args.steps} optimizer steps per run (the first left out), completions of up to {args.completion} tokens. "
        "Ratios are medians of per-round ratios of alternating fresh processes (the same load for both).",
        "",
        "| measured | off | on | on / off | target |",
        "|---|---|---|---|---|",
        f"| GRPO step, vLLM colocate, guard (`TRL_COMPAT_GUARD=1`) | {off * 1e3:.1f} ms | {on * 1e3:.1f} ms | "
        f"{guard_ratio:.3f}x | <= 1.02x |",
        f"| weight sync (whole state dict into the engine), guard's hook | {sync['sync_off_s'] * 1e3:.2f} ms | "
        f"{sync['sync_on_s'] * 1e3:.2f} ms | {sync['sync_on_s'] / sync['sync_off_s']:.3f}x | - |",
        f"| one generate of 8 prompts, `logprobs=0` asked (stand-in, not vLLM) | {sync['gen_s'] * 1e3:.1f} ms | "
        f"{sync['gen_logprobs_s'] * 1e3:.1f} ms | {sync['gen_logprobs_s'] / sync['gen_s']:.3f}x | - |",
        f"| GRPO step, no vLLM: every patch on vs `TRL_COMPAT_DISABLE='*'` (guard off) | {disabled * 1e3:.1f} ms | "
        f"{patched * 1e3:.1f} ms | {patch_ratio:.3f}x | <= 1.01x |",
        "",
        f"In the guarded runs the guard saw {stats['generations']} generate calls and checked {stats['rows_checked']} loss rows "
        f"against vLLM's completions per run, with {stats['alarms']} alarms.",
        "",
        f"- guard per step: {'met' if guard_ratio <= 1.02 else 'NOT met'} ({(guard_ratio - 1) * 100:+.1f} %)",
        f"- trl_compat's patches per step: {'met' if patch_ratio <= 1.01 else 'NOT met'} ({(patch_ratio - 1) * 100:+.1f} %)",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
