"""One rank of a real 2-process GRPO run with a chosen ``generation_batch_size`` (gloo, CPU), for
tests/patches/test_generation_batch_size_check.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/generation_batch_worker.py
MODEL_DIR OUT_DIR NUM_GENERATIONS GENERATION_BATCH_SIZE NUM_ITERATIONS STEPS`` with
``per_device_train_batch_size=2`` (a global batch of 4) and the dataset in order (``shuffle_dataset=False``).
Whether generation-batch-size-check is on is decided by the environment (``TRL_COMPAT_DISABLE``).
Observations, one line each (``GB|{json}``):

* ``config``: the ``GRPOConfig`` built, with its ``steps_per_generation``, or the ``ValueError`` it raised
  (then the rank stops);
* ``generate``: every call of the reward function: the prompts (their dataset indices) this rank scores;
* ``error``: the error ``trainer.train()`` raised (type and first line), or ``done`` with the steps run.
"""

import json
import os
import sys

RANK = int(os.environ.get("RANK", "0"))
PROMPTS = 16


def emit(event, **fields):
    line = "GB|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    num_generations, generation_batch_size, num_iterations, steps = map(int, sys.argv[3:7])

    import trl_compat  # before trl, as a user would

    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    emit("versions", status=trl_compat.status("generation-batch-size-check"))
    try:
        args, _ = grpo_run.make_config(
            out_dir,
            steps=steps,
            per_device_train_batch_size=2,
            num_generations=num_generations,
            generation_batch_size=generation_batch_size,
            num_iterations=num_iterations,
            shuffle_dataset=False,
        )
    except ValueError as exc:
        emit("config", error=str(exc))
        return
    emit("config", steps_per_generation=args.steps_per_generation, world_size=args.world_size)

    dataset = tiny.prompt_dataset(PROMPTS)
    index = {prompt: i for i, prompt in enumerate(dataset["prompt"])}

    def indexed_reward(prompts, completions, **kwargs):
        emit("generate", prompts=[index[p] for p in prompts])
        return tiny.varying_reward(prompts, completions)

    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[indexed_reward],
        args=args,
        train_dataset=dataset,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    try:
        trainer.train()
    except Exception as exc:  # reported, then the rank fails as TRL made it fail
        emit("error", type=type(exc).__name__, message=str(exc).splitlines()[0])
        raise
    emit("done", steps=trainer.state.global_step)


if __name__ == "__main__":
    main()
