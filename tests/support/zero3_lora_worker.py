"""One rank of a real 2-process DeepSpeed ZeRO-3 GRPO run with LoRA on a bf16 model (CPU, gloo),
for tests/patches/test_zero3_peft_mixed_dtype.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_lora_worker.py MODEL_DIR OUT_DIR [OPTION ...]``.
Options: ``--partitioned`` sets ``stage3_param_persistence_threshold`` to 0, so that every parameter
(norms, frozen base weights) is partitioned and released between uses, as a real model's large ones
are (tests/patches/test_peft_zero3_gc_reentrant.py); ``--peft-model`` builds the ``PeftModel`` itself
(``from_pretrained`` under ZeRO-Init, then peft's ``get_peft_model``) and passes it without
``peft_config``. ``gradient_checkpointing`` is left at GRPOConfig's default (True).
MODEL_DIR holds a tiny Qwen2 saved in bfloat16; TRL loads it from there in bf16 (``dtype``/``torch_dtype``
"auto") inside ZeRO-3's ``zero.Init``, adds LoRA through peft's ``get_peft_model`` and trains with
``bf16=True``. ZeRO-3 keeps parameters under ``stage3_param_persistence_threshold`` (default 1e5:
all of this tiny model's) whole on every rank and re-gathers them after each optimizer step,
with one buffer dtype per bucket in DeepSpeed 0.19.2. Whether zero3-peft-mixed-dtype is on is
decided by the environment (``TRL_COMPAT_DISABLE``). Observations, one line each (``Z3|{json}``):

* ``versions``: TRL, DeepSpeed, peft and the statuses of zero3-peft-mixed-dtype, peft-zero3-gc-reentrant and
  zero3-hooks-trace;
* ``adapters``: after ``GRPOTrainer(...)``: the dtypes of the LoRA and of the base parameters, the
  gradient checkpointing settings;
* ``train``: the losses, and per LoRA parameter whether its gathered value changed.
An error in ``trainer.train()`` is not caught: the rank dies with the traceback.
"""

import inspect
import sys

from zero3_worker import emit, finish, serialise_all_gathers, skip_shm_build

LR = 1e-2

DS_CONFIG = {
    "zero_optimization": {"stage": 3},  # default persistence threshold: the tiny parameters stay persistent
    "bf16": {"enabled": "auto"},
    # DeepSpeed's own scheduler: with LoRA the Trainer's no-weight-decay parameter group is empty, DeepSpeed drops it,
    # and torch >= 2.13's LR schedulers (strict zip) then fail with "zip() argument 2 is longer than argument 1".
    # min_lr == max_lr: a constant learning rate
    "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": LR, "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
    "train_micro_batch_size_per_gpu": "auto",
    # no "train_batch_size": DeepSpeed derives it from the other two and the world size (TRL 1.0's GRPOConfig
    # has transformers fill it before the world size is known: "4 != 4 * 1 * 2")
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "zero_allow_untested_optimizer": True,
}


def deepspeed_state_on_gloo():
    """accelerate's process state for DeepSpeed on gloo.

    transformers passes no backend for DeepSpeed, and accelerate >= 1.13 on a machine without GPUs then
    leaves it unset: DeepSpeed still joins the 2-process gloo group, but accelerate counts one process
    (``gather``: "invalid output tensor list at index 0 (expected length 2, got 1)"). TrainingArguments
    resets any state made before it, so the default backend itself is set to gloo."""
    from accelerate.state import PartialState

    original = PartialState._prepare_backend

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        return original(self, cpu, sagemaker_dp, backend or "gloo")

    PartialState._prepare_backend = _prepare_backend


def main():
    model_dir, out_dir, options = sys.argv[1], sys.argv[2], set(sys.argv[3:])
    skip_shm_build()
    serialise_all_gathers()

    import trl_compat  # before trl, as a user would

    import deepspeed
    import peft
    import torch
    import trl
    from peft import LoraConfig
    from transformers import AutoTokenizer
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    emit(
        "versions",
        trl=trl.__version__,
        deepspeed=deepspeed.__version__,
        peft=peft.__version__,
        status=trl_compat.status("zero3-peft-mixed-dtype"),
        gc_status=trl_compat.status("peft-zero3-gc-reentrant"),
        trace_status=trl_compat.status("zero3-hooks-trace"),
    )
    # TrainingArguments refuses bf16=True without a bf16 GPU unless use_cpu=True, which would turn off the
    # 2-process DeepSpeed set-up; DeepSpeed's CPU accelerator and torch's CPU kernels do run bf16.
    import transformers.training_args

    transformers.training_args.is_torch_bf16_gpu_available = lambda: True
    source = inspect.getsource(GRPOTrainer.__init__)
    dtype_key = "dtype" if 'model_init_kwargs.get("dtype")' in source else "torch_dtype"
    deepspeed_state_on_gloo()
    ds_config = dict(DS_CONFIG)
    if "--partitioned" in options:
        ds_config["zero_optimization"] = {"stage": 3, "stage3_param_persistence_threshold": 0}
    args, _ = grpo_run.make_config(
        out_dir,
        steps=2,
        deepspeed=ds_config,
        bf16=True,
        learning_rate=LR,
        warmup_steps=1,  # DeepSpeed >= 0.19.3 rejects warmup_num_steps=0 (min_lr == max_lr: no warm-up anyway)
        beta=0.0,
        model_init_kwargs={dtype_key: "auto"},
    )
    lora_config = LoraConfig(r=8, lora_alpha=16, target_modules=list(grpo_run.LORA_TARGETS), task_type="CAUSAL_LM")
    if "--peft-model" in options:
        from peft import get_peft_model
        from transformers import AutoModelForCausalLM

        # args holds the DeepSpeed config: transformers loads the model under ZeRO-Init, partitioned, in bf16;
        # peft's get_peft_model then adds fp32 adapters (autocast_adapter_dtype's default), as a user's script does
        model = AutoModelForCausalLM.from_pretrained(model_dir, **{dtype_key: torch.bfloat16})
        model, peft_config = get_peft_model(model, lora_config), None
    else:
        model, peft_config = model_dir, lora_config
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        peft_config=peft_config,
    )
    lora = {n: p for n, p in trainer.model.named_parameters() if "lora_" in n}
    base = [p for n, p in trainer.model.named_parameters() if "lora_" not in n]
    emit(
        "adapters",
        lora=sorted({str(p.dtype) for p in lora.values()}),
        base=sorted({str(p.dtype) for p in base}),
        count=len(lora),
        gradient_checkpointing=trainer.args.gradient_checkpointing,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    )

    def gathered():
        with deepspeed.zero.GatheredParameters(list(lora.values())):
            return {n: p.detach().float().clone() for n, p in lora.items()}

    before = gathered()
    trainer.train()
    after = gathered()
    emit(
        "train",
        losses=[e["loss"] for e in trainer.state.log_history if "loss" in e],
        changed=sorted(n for n in lora if not torch.equal(before[n], after[n])),
        count=len(lora),
    )
    finish()


if __name__ == "__main__":
    main()
