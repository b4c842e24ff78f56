"""One rank of a real 2-process DeepSpeed ZeRO-3 GRPO step with a reward *model*, for
tests/patches/test_reward_model_zero3.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_reward_worker.py
POLICY_DIR REWARD_DIR OUT_DIR``. ``reward_funcs`` is the reward model's directory, so TRL loads
it with ``AutoModelForSequenceClassification.from_pretrained`` inside ZeRO-3's ``zero.Init``,
as with a Hub id. Whether reward-model-zero3 is on is decided by the environment
(``TRL_COMPAT_DISABLE``). Observations, one line each (``Z3|{json}``, as zero3_worker.py):

* ``reward_model``: after ``GRPOTrainer(...)``: the type in ``reward_funcs``, whether its
  weights are partitioned on this rank (local numel 0), the embedding's ``padding_idx``.
* ``reward_forward``: every forward of the reward model during training: the ``input_ids``
  and ``attention_mask`` TRL gave it and the logits it returned (GRPO's rewards).
* ``train``: steps and losses. An error in ``train()`` is not caught: the rank dies with
  TRL's traceback.
"""

import math
import sys

from zero3_worker import DS_CONFIG, emit, finish, serialise_all_gathers, skip_shm_build


def main():
    policy_dir, reward_dir, out_dir = sys.argv[1:4]
    skip_shm_build()
    serialise_all_gathers()

    import trl_compat  # before trl, as a user would

    import trl
    from transformers import AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    import tiny

    emit("versions", trl=trl.__version__, status=trl_compat.status("reward-model-zero3"))
    args = GRPOConfig(
        output_dir=out_dir,
        deepspeed=DS_CONFIG,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,
        max_prompt_length=16,
        max_completion_length=8,
        max_steps=1,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=policy_dir,
        reward_funcs=reward_dir,
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=AutoTokenizer.from_pretrained(policy_dir),
    )
    reward = trainer.reward_funcs[0]
    bare = getattr(reward, "module", reward)
    params = list(bare.parameters())
    emit(
        "reward_model",
        type=type(reward).__name__,
        bare=type(bare).__name__,
        local_numel=sum(p.numel() for p in params),
        full_numel=sum(getattr(p, "ds_numel", p.numel()) for p in params),
        padding_idx=bare.get_input_embeddings().padding_idx,
        engines=len(getattr(trainer, "_trl_compat_reward_engines", [])),
    )

    def record(module, args, kwargs, output):
        emit(
            "reward_forward",
            input_ids=kwargs["input_ids"].tolist(),
            attention_mask=kwargs["attention_mask"].tolist(),
            logits=output.logits.detach().float().tolist(),
        )

    bare.register_forward_hook(record, with_kwargs=True)
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    emit("train", steps=trainer.state.global_step, losses=losses, finite=bool(losses) and all(math.isfinite(x) for x in losses))
    finish()


if __name__ == "__main__":
    main()
