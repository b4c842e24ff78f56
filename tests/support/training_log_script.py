"""A GRPO training script that never imports trl_compat and configures no logging, for
tests/activation/test_training_log.py.

    <launcher> tests/support/training_log_script.py MODEL_DIR OUT_DIR [--logging none|transformers|basic]

``--logging transformers``: transformers' own verbosity set to INFO (it configures the
``transformers`` logger only); ``basic``: ``logging.basicConfig()`` (a root handler, root at
WARNING). Trains a tiny Qwen2 for 1 GRPO step (``tests/support/grpo_run.py``), then prints one
line ``TLOG|{json}`` per rank (and writes it to ``OUT_DIR/tlog-rank<N>.json``): the applied
patch ids and the ``trl_compat/*`` keys of the first logged metrics.
"""

import argparse
import json
import os
import sys


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--logging", choices=("none", "transformers", "basic"), default="none")
    args = parser.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    if args.logging == "transformers":
        import transformers

        transformers.utils.logging.set_verbosity_info()
    elif args.logging == "basic":
        import logging

        logging.basicConfig()

    import grpo_run

    trainer = grpo_run.make_trainer(os.path.join(args.out_dir, f"rank{rank}"), model=args.model_dir, steps=1)
    trainer.train()
    first = trainer.state.log_history[0]
    result = {
        "rank": rank,
        "trl_compat_imported": "trl_compat" in sys.modules,
        "metrics": {k: v for k, v in first.items() if k.startswith("trl_compat/")},
        "applied": None,
    }
    if result["trl_compat_imported"]:
        import trl_compat  # imported at start-up: this only binds the name

        result["applied"] = trl_compat.applied()
    print("TLOG|" + json.dumps(result), flush=True)
    # also as a file: two ranks printing at once can interleave their lines on a shared stdout
    with open(os.path.join(args.out_dir, f"tlog-rank{rank}.json"), "w") as f:
        json.dump(result, f)

    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    # As tests/support/grpo_script.py: skip the interpreter's teardown (gloo's threads).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
