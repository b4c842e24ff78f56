"""One rank of a real 2-process DeepSpeed ZeRO-3 GRPO run with beta > 0 on a bf16 model instance (CPU, gloo),
for tests/patches/test_ref_model_like_policy.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_ref_dtype_worker.py MODEL_DIR OUT_DIR``.
MODEL_DIR holds a tiny Qwen2 saved in bfloat16. The policy is loaded from there by the script (under ZeRO-Init,
as transformers does once the DeepSpeed config is in the arguments) in bf16 with ``attn_implementation="eager"``
and passed as an instance; ``beta=0.1`` makes TRL build the reference model from the checkpoint. Whether
ref-model-like-policy is on is decided by the environment (``TRL_COMPAT_DISABLE``). Observations, one line each
(``Z3|{json}``):

* ``versions``: TRL, DeepSpeed and the patch's status;
* ``models``: after ``GRPOTrainer(...)``: the parameter dtypes and attention implementation of the policy and
  of the reference model (its DeepSpeed engine's module);
* ``train``: the logged KL of each step (step 1: before any update, the reference equals the policy).
"""

import sys

from zero3_lora_worker import DS_CONFIG, deepspeed_state_on_gloo
from zero3_worker import emit, finish, serialise_all_gathers, skip_shm_build


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    skip_shm_build()
    serialise_all_gathers()

    import trl_compat  # before trl, as a user would

    import deepspeed
    import torch
    import transformers
    import trl
    from packaging.version import Version
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    emit("versions", trl=trl.__version__, deepspeed=deepspeed.__version__, status=trl_compat.status("ref-model-like-policy"))
    import transformers.training_args

    transformers.training_args.is_torch_bf16_gpu_available = lambda: True  # DeepSpeed's CPU accelerator runs bf16
    deepspeed_state_on_gloo()
    args, _ = grpo_run.make_config(out_dir, steps=2, deepspeed=dict(DS_CONFIG), bf16=True, warmup_steps=1, beta=0.1)
    # args holds the DeepSpeed config: transformers loads the policy under ZeRO-Init, partitioned
    dtype_key = "dtype" if Version(transformers.__version__) >= Version("4.56.0") else "torch_dtype"
    model = AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager", **{dtype_key: torch.bfloat16})
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    ref = getattr(trainer.ref_model, "module", trainer.ref_model)
    emit(
        "models",
        policy=sorted({str(p.dtype) for p in trainer.model.parameters()}),
        ref=sorted({str(p.dtype) for p in ref.parameters()}),
        policy_attn=trainer.model.config._attn_implementation,
        ref_attn=ref.config._attn_implementation,
    )
    trainer.train()
    emit("train", kl=[e["kl"] for e in trainer.state.log_history if "kl" in e])
    finish()


if __name__ == "__main__":
    main()
