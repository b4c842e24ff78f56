"""One rank of a real 2-process GRPO run of the tiny Qwen2-VL (tests/support/tiny_vlm.py) on a text-only
dataset under DDP (gloo, CPU), for tests/patches/test_vlm_ddp_find_unused.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/vlm_ddp_worker.py OUT_DIR``.
Two trainers, one after the other, in the same processes, each trained 2 steps with GRPO's defaults
(gradient checkpointing as the release sets it):

1. ``unpatched``: vlm-ddp-find-unused reverted (``unpatched.without_patch``); the step's error is caught and
   reported (the vision tower got no gradient, so DDP's second forward refuses to start);
2. ``patched``: the patch back in place, a fresh model.

Observations, one line each (``VD|{json}``): ``versions`` (TRL's version and the patch's status), then per
phase ``find_unused`` (``args.ddp_find_unused_parameters`` and the accelerator's DDP handler's flag after
``__init__``), ``error`` (type and message of what ``train()`` raised, or nothing), ``train`` (losses,
how far the language model's and the vision tower's weights moved), then ``done``.
"""

import json
import os
import sys

RANK = int(os.environ.get("RANK", "0"))
PATCH_ID = "vlm-ddp-find-unused"


def emit(event, **fields):
    line = "VD|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def text_only_dataset(n=8):
    """tiny_vlm's conversational prompts without their images."""
    import tiny_vlm

    return tiny_vlm.dataset(n).remove_columns("image")


def moved(before, model, part):
    """How far the parameters whose names contain ``part`` moved from ``before`` (the largest change)."""
    return max(float((p.detach() - before[n]).abs().max()) for n, p in model.named_parameters() if part in n)


def run(phase, out_dir):
    import torch

    import tiny
    import tiny_vlm

    model = tiny_vlm.make_model()
    trainer = tiny_vlm.make_trainer(
        os.path.join(out_dir, f"{phase}-rank{RANK}"),
        model=model,
        processor=tiny_vlm.make_processor(),
        train_dataset=text_only_dataset(),
        reward_funcs=[tiny.varying_reward],
        steps=2,
    )
    handler = getattr(trainer.accelerator, "ddp_handler", None)
    emit(
        "find_unused",
        phase=phase,
        args=trainer.args.ddp_find_unused_parameters,
        handler=getattr(handler, "find_unused_parameters", None),
        distributed_type=str(trainer.accelerator.distributed_type),
        gradient_checkpointing=trainer.args.gradient_checkpointing,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    )
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    try:
        trainer.train()
    except RuntimeError as exc:
        emit("error", phase=phase, type=type(exc).__name__, message=str(exc))
    else:
        emit("error", phase=phase, type=None, message=None)
    bare = trainer.accelerator.unwrap_model(trainer.model)
    emit(
        "train",
        phase=phase,
        losses=[e["loss"] for e in trainer.state.log_history if "loss" in e],
        steps=trainer.state.global_step,
        wrapped=type(trainer.model_wrapped).__name__,
        lm_moved=moved(before, bare, "lm_head"),
        vision_moved=moved(before, bare, "visual"),
    )
    torch.distributed.barrier()


def main():
    out_dir = sys.argv[1]
    # transformers 5 makes accelerate's multi-CPU (DDP) state only when asked to run on the CPU; without it the
    # ranks train side by side, unwrapped
    os.environ["ACCELERATE_USE_CPU"] = "true"

    import trl_compat  # before trl, as a user would

    import trl
    from trl import GRPOTrainer  # noqa: F401 - runs the patches

    from unpatched import without_patch

    emit("versions", trl=trl.__version__, status=trl_compat.status(PATCH_ID))
    with without_patch(PATCH_ID):
        run("unpatched", out_dir)
    run("patched", out_dir)
    emit("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown after a good run


if __name__ == "__main__":
    main()
