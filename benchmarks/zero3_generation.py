"""Generation time under DeepSpeed ZeRO-3: hooks removed (zero3-unwrap) vs left in place (TRL 0.15's early return).

TRL 0.15.0-0.15.2's GRPOTrainer unwraps ``self.model`` (the bare module) for
generation; ``remove_hooks`` then returns early (no ``optimizer`` on the bare
module), so generation runs on the gathered weights *with* DeepSpeed's ZeRO-3
hooks still on every submodule. trl_compat's zero3-unwrap hands TRL the engine
instead, so the hooks are taken off while generating (what TRL 0.16 does).

One run, 2 processes on the CPU, the same engine and prompts for both variants,
alternating A/B rounds; the result is the ratio of medians. Needs trl 0.15.x with
deepspeed (and zero3-unwrap applied). Writes benchmarks/zero3_generation.md::

    tox -e bench-zero3_generation    or    python benchmarks/zero3_generation.py [--out benchmarks/zero3_generation.md]
"""

import argparse
import datetime
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

MODEL = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=4,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=256,
)
BATCH, NEW_TOKENS, ROUNDS = 4, 32, 5


def _test_helpers_on_path():
    """The tests' helpers (tiny, zero3_worker): tests/support/, where they are moving, or tests/."""
    for folder in (os.path.join(ROOT, "tests", "support"), os.path.join(ROOT, "tests", "support")):
        if os.path.isdir(folder):
            sys.path.insert(0, folder)


def worker(model_dir):
    _test_helpers_on_path()
    import zero3_worker  # the test worker's DeepSpeed-on-CPU set-up, shared

    zero3_worker.skip_shm_build()
    zero3_worker.serialise_all_gathers()

    import trl_compat

    import deepspeed
    import torch
    import trl
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.integrations import HfDeepSpeedConfig
    from trl.models import utils as trl_utils

    import tiny

    rank = int(os.environ["RANK"])
    if trl_compat.status("zero3-unwrap") != trl_compat.APPLIED or not trl.__version__.startswith("0.15."):
        raise SystemExit(f"needs trl 0.15.x with zero3-unwrap applied; got trl {trl.__version__}: {trl_compat.report()}")
    ds_config = {
        "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_allow_untested_optimizer": True,
    }
    keep = HfDeepSpeedConfig(ds_config)  # noqa: F841 - while alive, from_pretrained partitions at load
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=ds_config))
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine, _ = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-5))
    offload = engine.optimizer.parameter_offload
    fetches = [0]
    original_fetch = offload.pre_sub_module_forward_function

    def fetch(sub_module):
        fetches[0] += 1
        return original_fetch(sub_module)

    offload.pre_sub_module_forward_function = fetch

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt = tokenizer(tiny.prompt_dataset(BATCH)["prompt"], return_tensors="pt", padding=True)
    variants = {
        # TRL 0.15's own function on the bare module, as GRPOTrainer 0.15.x calls it.
        "upstream": trl_utils.unwrap_model_for_generation.__wrapped__,
        "ours": trl_utils.unwrap_model_for_generation,
    }
    times = {name: [] for name in variants}
    counts, tokens = {}, {}
    for round_ in range(ROUNDS + 1):  # round 0 warms up
        for name, unwrap in variants.items() if round_ % 2 else reversed(variants.items()):
            torch.distributed.barrier()
            fetches[0] = zero3_worker.ALLGATHERS[0] = 0
            start = time.perf_counter()
            with unwrap(model, accelerator) as unwrapped:
                hooks_inside = len(offload.forward_hooks)
                with torch.no_grad():
                    out = unwrapped.generate(**prompt, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
            elapsed = time.perf_counter() - start
            if round_:
                times[name].append(elapsed)
            counts[name] = dict(hooks_inside=hooks_inside, fetches=fetches[0], allgathers=zero3_worker.ALLGATHERS[0])
            tokens[name] = out[:, -NEW_TOKENS:].tolist()
    assert tokens["ours"] == tokens["upstream"], "the two variants generated different tokens"
    assert len(offload.forward_hooks) > 0
    params = sum(p.ds_numel for p in model.parameters())
    tensors = len(list(model.parameters()))
    if rank == 0:
        print(
            "BENCH|"
            + json.dumps(
                dict(
                    times=times,
                    counts=counts,
                    params=params,
                    tensors=tensors,
                    trl=trl.__version__,
                    deepspeed=deepspeed.__version__,
                    torch=torch.__version__,
                    threads=torch.get_num_threads(),
                )
            ),
            flush=True,
        )
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(HERE, "zero3_generation.md"))
    parser.add_argument("--worker", metavar="MODEL_DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker)

    _test_helpers_on_path()
    import tiny

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = tiny.save_tiny(os.path.join(tmp, "model"), "qwen2", model=tiny.make_model("qwen2", **MODEL))
        env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu")
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            os.path.abspath(__file__),
            "--worker",
            model_dir,
        ]
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH|")]
    if proc.returncode != 0 or not lines:
        sys.stdout.write(proc.stdout[-8000:])
        raise SystemExit(f"benchmark failed (exit status {proc.returncode})")
    result = json.loads(lines[-1][len("BENCH|") :])
    upstream, ours = (statistics.median(result["times"][k]) for k in ("upstream", "ours"))
    up, us = result["counts"]["upstream"], result["counts"]["ours"]
    header = (
        "| variant | ZeRO-3 hooks during generation | median time per call (s) "
        "| DeepSpeed submodule fetches per call | all-gathers per call |"
    )
    rounds = {name: ", ".join(f"{t:.3f}" for t in result["times"][name]) for name in ("upstream", "ours")}
    report = f"""# ZeRO-3 generation: hooks removed (zero3-unwrap) vs left in place (TRL 0.15 early return)

`tox -e bench-zero3_generation` (`python benchmarks/zero3_generation.py`), one run, {datetime.date.today().isoformat()}.

Setup: DeepSpeed ZeRO-3 on the CPU, 2 processes (gloo, 1 thread each), every parameter partitioned
(`stage3_param_persistence_threshold: 0`); tiny Qwen2 with {result["params"]:,} parameters
(hidden {MODEL["hidden_size"]}, {MODEL["num_hidden_layers"]} layers); greedy generation of {NEW_TOKENS} tokens for
{BATCH} prompts on each rank, inside `unwrap_model_for_generation` with gathering on (the default).
trl {result["trl"]}, deepspeed {result["deepspeed"]}, torch {result["torch"]}, Python {platform.python_version()},
{os.cpu_count()} CPU cores (load average {os.getloadavg()[0]:.1f} at the end: shared machine).
{ROUNDS} timed rounds per variant after one warm-up, A/B order alternating;
median of the rounds. Both variants generate identical tokens.

- **upstream**: TRL's own `unwrap_model_for_generation(trainer.model, accelerator)`, as GRPOTrainer
  0.15.0–0.15.2 calls it: `remove_hooks` returns early on the bare module, the ZeRO-3 hooks stay on.
- **ours**: the same call through trl_compat's zero3-unwrap, which unwraps the engine: hooks removed while
  generating, put back afterwards (what TRL 0.16 does).

{header}
|---|---|---|---|---|
| upstream (hooks left in place) | {up["hooks_inside"]} | {upstream:.3f} | {up["fetches"]} | {up["allgathers"]} |
| ours (hooks removed) | {us["hooks_inside"]} | {ours:.3f} | {us["fetches"]} | {us["allgathers"]} |

**Ratio upstream / ours: {upstream / ours:.2f}x** (rounds, s: upstream {rounds["upstream"]};
ours {rounds["ours"]}).

Both variants gather the {result["tensors"]} parameter tensors once when entering the context (one
all-gather each). With the hooks left in place, every forward pass of the {NEW_TOKENS}-token generation
also runs DeepSpeed's fetch/release on each submodule ({up["fetches"] / NEW_TOKENS:.0f} per token) and
re-gathers parameters ({up["allgathers"] - us["allgathers"]} extra all-gathers in all).

The time includes entering and leaving the context (gathering all parameters once, removing and
re-registering the hooks), as in GRPO. The all-gathers of both variants wait for completion at
launch (the test worker's workaround for a DeepSpeed/gloo race, see tests/support/zero3_worker.py). This is
a small model on 2 CPU cores: the absolute numbers say little about GPUs, where the per-token cost
of the hooks (a fetch and release for each submodule, re-gathers) competes with much faster
kernels.
"""
    with open(args.out, "w") as handle:
        handle.write(report)
    print(report)


if __name__ == "__main__":
    main()
