"""One rank of a real 2-process FSDP2 GRPO run on the CPU (gloo) with the off-policy guard on, for
tests/guard/test_weights.py (check W1 on TRL 0.18/0.19's FSDP2 sync, ``fsdp2-vllm-sync``).

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/guard_fsdp2_worker.py MODEL_DIR OUT_DIR``
with ``TRL_COMPAT_GUARD=1``; whether fsdp2-vllm-sync is on is decided by ``TRL_COMPAT_DISABLE``.
Prints ``G2|{json}`` lines: the guard's alarms and counts at the end.

As tests/support/fsdp2_worker.py: TRL's real ``GRPOTrainer`` built with ``use_vllm=False`` and
FSDP2-sharded the way accelerate's ``fsdp_version: 2`` does it. Each rank also builds the vLLM
stand-in's ``LLM`` (colocate mode: one engine per rank), which the guard instruments. Three steps,
each: TRL's real ``_move_model_to_vllm`` (colocate, FSDP2 plugin), a vLLM ``generate`` made from a
frame whose ``self`` is the trainer (the guard finds its trainer on the stack, as in TRL's own
generation code), then a real GRPO step on the shards (TRL's ``training_step``, generating with the
sharded model) and an AdamW step.
"""

import json
import os
import sys

from fsdp2_worker import Fsdp2Plugin, cpu_stands_in_for_cuda

RANK = int(os.environ.get("RANK", "0"))


def emit(event, **fields):
    line = "G2|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def generate_for(self, llm, prompts):
    """``llm.generate`` called with the trainer as ``self`` on the stack."""
    from vllm import SamplingParams

    return llm.generate(prompts, sampling_params=SamplingParams(n=2, temperature=1.0, max_tokens=8), use_tqdm=False)


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]

    import trl_compat
    import trl_compat.guard as offpolicy
    from trl_compat.guard import testing

    import torch
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from trl import GRPOConfig, GRPOTrainer
    from vllm import LLM

    import tiny

    cpu_stands_in_for_cuda(torch)
    emit("versions", status=trl_compat.status("fsdp2-vllm-sync"), guard=offpolicy.mode())
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,
        max_prompt_length=16,
        max_completion_length=8,
        max_steps=3,
        learning_rate=1e-2,
        beta=0.0,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        bf16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_vllm=False,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=tiny.varying_reward,
        args=args,
        train_dataset=tiny.prompt_dataset(16),
        processing_class=tiny.make_tokenizer(),
    )
    model = trainer.model
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in [m for m in model.modules() if type(m).__name__ == "Qwen2DecoderLayer"]:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    trainer.model_wrapped = model
    trainer.is_fsdp_enabled = True

    llm = LLM(model=model_dir, dtype="float32", enable_prefix_caching=True)
    trainer.llm, trainer.vllm_mode = llm, "colocate"
    trainer.accelerator.state.fsdp_plugin = Fsdp2Plugin()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    prompts = tiny.prompt_dataset(8)
    trainer.current_gradient_accumulation_steps = 1
    for step in range(3):
        trainer._move_model_to_vllm()
        generate_for(trainer, llm, [prompts[2 * step + RANK]["prompt"]])
        row = prompts[2 * step + RANK]
        trainer.accelerator.state.fsdp_plugin = None  # TRL's own generation in training_step: no vLLM
        trainer.training_step(model, [{"prompt": row["prompt"]}] * args.num_generations)
        trainer.accelerator.state.fsdp_plugin = Fsdp2Plugin()
        optimizer.step()
        optimizer.zero_grad()
        trainer.state.global_step += 1
    emit(
        "guard",
        alarms=[dict(check=a.check, step=a.step, fix=a.fix, figures=a.figures, line=a.line()) for a in offpolicy.alarms()],
        stats=offpolicy.stats(),
        figures=testing.figures(trainer),  # no Trainer loop here: nothing took them for the logs
        synced_names=len(llm.model.received_names),
    )
    torch.distributed.barrier()
    emit("done")
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
