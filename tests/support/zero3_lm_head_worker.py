"""One rank of a real 2-process DeepSpeed ZeRO-3 GRPO run in bf16 with ``cast_lm_head_to_fp32=True`` (CPU, gloo),
for tests/patches/test_lm_head_fp32_sharded.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_lm_head_worker.py MODEL_DIR OUT_DIR``.
MODEL_DIR holds a tiny Qwen2 (untied head) saved in bfloat16. TRL loads the policy and, with ``beta=0.1``, the
reference from there in bf16 inside ZeRO-3's ``zero.Init``; ``stage3_param_persistence_threshold=0`` keeps every
parameter partitioned between uses, as a real model's LM head is (far above the default threshold). Two trainers,
one after the other, in the same processes (one launch for both answers):

1. lm-head-fp32-sharded applied: one GRPO step (a generation on the gathered model, the policy's and the
   reference's log-prob forwards through ZeRO-3's per-module fetch, the backward and the optimizer step);
2. the patch reverted while a second trainer is built (trl_compat.revert / install): its ``train()`` is
   expected to fail, and is caught.

Observations, one line each (``Z3|{json}``):

* ``versions``: TRL, DeepSpeed and the patch's status;
* ``heads``: after ``GRPOTrainer(...)`` (per trainer): for the policy's and the reference's LM head, the dtype
  and size of the parameter's local placeholder and the dtype of this rank's shard (``ds_tensor``);
* ``calls``: after the patched step: per head (its forward wrapped), the calls seen, the dtypes of the weight as
  the head got it (gathered) and of its output, and the largest difference between the output and
  ``F.linear(input.float(), weight.float())`` computed from that gathered weight;
* ``train``: the losses, and whether this rank's shard of the policy's head changed;
* ``unpatched``: the error of the second trainer's ``train()`` (None if it trained).
"""

import inspect
import sys
import traceback

from zero3_lora_worker import DS_CONFIG, deepspeed_state_on_gloo
from zero3_worker import emit, finish, serialise_all_gathers, skip_shm_build

PATCH_ID = "lm-head-fp32-sharded"


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    skip_shm_build()
    serialise_all_gathers()

    import trl_compat  # before trl, as a user would

    import deepspeed
    import torch
    import trl
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    emit("versions", trl=trl.__version__, deepspeed=deepspeed.__version__, status=trl_compat.status(PATCH_ID))
    import transformers.training_args

    # TrainingArguments refuses bf16=True without a bf16 GPU unless use_cpu=True (which turns DeepSpeed off);
    # DeepSpeed's CPU accelerator and torch's CPU kernels run bf16
    transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    deepspeed_state_on_gloo()
    source = inspect.getsource(GRPOTrainer.__init__)
    dtype_key = "dtype" if 'model_init_kwargs.get("dtype")' in source else "torch_dtype"

    def heads(trainer):
        ref = getattr(trainer.ref_model, "module", trainer.ref_model)
        return {"policy": trainer.model.lm_head, "ref": ref.lm_head}

    def make_trainer(label):
        ds_config = dict(DS_CONFIG, zero_optimization={"stage": 3, "stage3_param_persistence_threshold": 0})
        args, _ = grpo_run.make_config(
            f"{out_dir}/{label}",
            steps=1,
            deepspeed=ds_config,
            bf16=True,
            warmup_steps=1,  # DeepSpeed >= 0.19.3 rejects warmup_num_steps=0
            beta=0.1,
            cast_lm_head_to_fp32=True,
            model_init_kwargs={dtype_key: "auto"},
        )
        trainer = GRPOTrainer(
            model=model_dir,
            reward_funcs=[tiny.varying_reward],
            args=args,
            train_dataset=tiny.prompt_dataset(8),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
        )
        emit(
            "heads",
            trainer=label,
            **{
                name: {
                    "placeholder": str(head.weight.dtype),
                    "placeholder_numel": head.weight.numel(),
                    "shard": str(head.weight.ds_tensor.dtype) if hasattr(head.weight, "ds_tensor") else None,
                }
                for name, head in heads(trainer).items()
            },
        )
        return trainer

    calls = {}

    def observe(trainer):
        """Each head's forward (the patch's, which runs after ZeRO-3's fetch and TRL's input cast) wrapped: the
        weight it gets is the gathered one."""
        for name, head in heads(trainer).items():
            seen = calls[name] = {"calls": 0, "weight": set(), "output": set(), "max_diff": 0.0}
            forward = head.forward

            def observed(input, forward=forward, head=head, seen=seen):
                output = forward(input)
                bias = None if head.bias is None else head.bias.float()
                with torch.no_grad():
                    want = torch.nn.functional.linear(input.float(), head.weight.float(), bias)
                seen["calls"] += 1
                seen["weight"].add(str(head.weight.dtype))
                seen["output"].add(str(output.dtype))
                seen["max_diff"] = max(seen["max_diff"], float((output.detach().float() - want).abs().max()))
                return output

            head.forward = observed

    def shard(trainer):
        return trainer.model.lm_head.weight.ds_tensor.detach().float().clone()

    # 1. patched
    trainer = make_trainer("patched")
    observe(trainer)
    before = shard(trainer)
    trainer.train()
    emit("calls", **{name: {k: sorted(v) if isinstance(v, set) else v for k, v in seen.items()} for name, seen in calls.items()})
    emit(
        "train",
        losses=[e["loss"] for e in trainer.state.log_history if "loss" in e],
        head_changed=not torch.equal(before, shard(trainer)),
    )

    # 2. the patch reverted while the trainer is built
    trl_compat.revert(PATCH_ID)
    try:
        trainer = make_trainer("unpatched")
    finally:
        trl_compat.install(PATCH_ID)
    error = None
    try:
        trainer.train()
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        error = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]}
    emit("unpatched", error=error, status=trl_compat.status(PATCH_ID))
    finish()


if __name__ == "__main__":
    main()
