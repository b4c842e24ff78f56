"""One rank of a real 2-process GRPO run with ``top_entropy_quantile < 1`` (gloo, CPU), for
tests/patches/test_entropy_mask_gather_hang.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/entropy_worker.py MODEL_DIR OUT_DIR``.
Whether entropy-mask-gather-hang is on is decided by the environment (``TRL_COMPAT_DISABLE``).
The ranks differ in ``max_completion_length`` (8 and 5 tokens; the tiny model never samples EOS
within them), so each rank holds a different number of completion tokens, as ranks whose
completions stop at EOS at different points do. Observations, one line each (``EM|{json}``):

* ``versions``: TRL's version and the patch's status;
* ``enter``: a ``get_high_entropy_mask`` call starts (a hung gather leaves it without ``mask``);
* ``mask``: every ``get_high_entropy_mask`` call: this rank's non-padding entropies, the quantile
  asked for, the thresholds ``torch.quantile`` returned inside the call and the tokens kept;
* ``train``: the losses, then ``done`` once both ranks finished.
An error in ``trainer.train()`` is not caught: the rank dies with TRL's traceback.
"""

import json
import os
import sys

RANK = int(os.environ.get("RANK", "0"))
COMPLETION_LENGTHS = (8, 5)  # per rank


def emit(event, **fields):
    line = "EM|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]

    import trl_compat  # before trl, as a user would

    import torch
    import trl
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    emit("versions", trl=trl.__version__, status=trl_compat.status("entropy-mask-gather-hang"))
    args, _ = grpo_run.make_config(out_dir, steps=2, top_entropy_quantile=0.2, max_completion_length=COMPLETION_LENGTHS[RANK])
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )

    thresholds = []
    quantile = torch.quantile

    def recording_quantile(*a, **k):
        result = quantile(*a, **k)
        thresholds.append(float(result))
        return result

    method = trainer.get_high_entropy_mask  # the class's method (TRL's, or the patch's)

    def observed(entropies, mask, threshold, *rest, **kwargs):
        emit("enter")
        del thresholds[:]
        torch.quantile = recording_quantile
        try:
            kept = method(entropies, mask, threshold, *rest, **kwargs)
        finally:
            torch.quantile = quantile
        local = entropies[mask.bool()].float()
        emit("mask", local=local.tolist(), q=float(threshold), thresholds=list(thresholds), kept=int(kept.sum()))
        return kept

    trainer.get_high_entropy_mask = observed
    trainer.train()
    emit("train", losses=[e["loss"] for e in trainer.state.log_history if "loss" in e])

    torch.distributed.barrier()
    emit("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown after a good run


if __name__ == "__main__":
    main()
