"""A GRPO training script that never imports trl_compat, for tests/activation/test_activation.py.

    <launcher> tests/support/grpo_script.py MODEL_DIR OUT_DIR [--zero3]

Run by torchrun or ``accelerate launch`` (2 ranks, gloo, CPU), under ``trl-compat run``,
with ``TRL_COMPAT_AUTO=1``, or with neither. Each rank trains a tiny Qwen2 for 2 GRPO steps
(``tests/support/grpo_run.py``) and writes ``OUT_DIR/rank<RANK>.json``: whether trl_compat was in
``sys.modules`` before this script's first line ran (start-up activation), how it got there,
the patch statuses after training, the losses, and with ``--zero3`` (DeepSpeed ZeRO-3, the
config of tests/support/zero3_worker.py) the number of ZeRO-3 forward hooks on the engine at the
start of training and while each GRPO generation ran: 0 with ``zero3-unwrap`` (generation on
gathered weights, hooks removed), all of them without it (TRL 0.15's early return).
"""

import sys

TRL_COMPAT_AT_START = "trl_compat" in sys.modules  # first: nothing of ours has run yet

import argparse
import json
import math
import os


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--zero3", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))

    overrides = {}
    if args.zero3:
        import zero3_worker  # imports nothing of trl_compat

        zero3_worker.skip_shm_build()
        zero3_worker.serialise_all_gathers()
        overrides = dict(deepspeed=zero3_worker.DS_CONFIG, per_device_train_batch_size=2)

    from transformers import TrainerCallback

    import grpo_run

    observed = {"hooks_baseline": None, "hooks_during_generation": []}

    class ZeroHooks(TrainerCallback):
        def on_train_begin(self, *unused, **kwargs):
            offload = trainer.model_wrapped.optimizer.parameter_offload
            observed["hooks_baseline"] = len(offload.forward_hooks)
            bare = trainer.model
            original = bare.generate

            def generate(*a, **k):  # GRPO generates on the unwrapped (bare) module
                observed["hooks_during_generation"].append(len(offload.forward_hooks))
                return original(*a, **k)

            bare.generate = generate

    trainer = grpo_run.make_trainer(os.path.join(args.out_dir, f"rank{rank}"), model=args.model_dir, steps=2, **overrides)
    if args.zero3:
        trainer.add_callback(ZeroHooks())
    trainer.train()

    losses = grpo_run.train_losses(trainer.state.log_history)
    result = {
        "rank": rank,
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
        "distributed_type": str(trainer.accelerator.distributed_type),
        "trl_compat_at_start": TRL_COMPAT_AT_START,
        "trl_compat_imported": "trl_compat" in sys.modules,
        "losses": losses,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses),
        **observed,
    }
    if result["trl_compat_imported"]:
        import trl_compat  # already imported by start-up: this only binds the name
        import trl_compat.activation

        result["how"] = trl_compat.activation.this_process()
        result["statuses"] = {p.id: p.status for p in trl_compat.report()}
    path = os.path.join(args.out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w") as fh:
        json.dump(result, fh)
    os.replace(path + ".tmp", path)

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    # Skip the interpreter's teardown: gloo's and DeepSpeed's CPU threads sometimes abort
    # there after everything has passed (see tests/support/zero3_worker.py's finish()).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
