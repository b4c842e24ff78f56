"""One rank of a 2-process DeepSpeed ZeRO-3 GRPO run with evaluation, for tests/patches/test_grpo_eval_014.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_eval_worker.py MODEL_DIR OUT_DIR``
(TRL 0.14.0 cells). Prints one ``Z3|{json}`` line per observation (``zero3_worker.emit``).

``train()`` with ``eval_on_start``: the evaluation runs inside training, where ``Trainer.model``
is the bare module and ``model_wrapped`` the DeepSpeed engine (grpo-eval-0.14 and zero3-unwrap
both applied). At the end of that evaluation (``on_evaluate``), still before any optimizer step,
the worker reports the logged entry, then calls ``evaluate()`` with zero3-unwrap reverted, with
grpo-eval-0.14 reverted (each is put back right after; both fail before any rank-specific work,
symmetrically on the two ranks), and once more with everything applied. Then one GRPO step.

Everything observed happens before the first optimizer step on purpose: on this CPU set-up
(gloo, torch 2.13) DeepSpeed ZeRO-3 training steps of TRL 0.14.0 are not bit-reproducible, and
about one launch in five gets a NaN gradient norm in its first step, after which any
generation dies in ``torch.multinomial``; that is no business of these patches.
"""

import sys

from zero3_worker import DS_CONFIG, emit, finish, serialise_all_gathers, skip_shm_build

IDS = ("grpo-eval-0.14", "zero3-unwrap", "zero3-hooks-api")


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    skip_shm_build()
    serialise_all_gathers()  # DeepSpeed 0.16 gloo all-gathers finish out of order on the CPU (see zero3_worker)

    import trl_compat

    import trl
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import tiny

    statuses = {p.id: p.status for p in trl_compat.report() if p.id in IDS}
    emit("versions", trl=trl.__version__, statuses=statuses)

    args = GRPOConfig(
        output_dir=out_dir,
        deepspeed=DS_CONFIG,
        per_device_train_batch_size=2,  # TRL 0.14: prompts per device, each with num_generations completions
        per_device_eval_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,
        max_prompt_length=16,
        max_completion_length=8,
        max_steps=1,
        eval_strategy="steps",
        eval_steps=100,  # no evaluation after the step: only the one at the start
        eval_on_start=True,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    state = {"done": False}

    class Observer(TrainerCallback):
        def on_evaluate(self, args, train_state, control, **kwargs):
            if state["done"]:  # the evaluate() calls below come through here too
                return
            state["done"] = True
            trainer = state["trainer"]
            engine = trainer.model_wrapped
            offload = engine.optimizer.parameter_offload
            emit(
                "in_training_eval",
                step=train_state.global_step,
                entry=train_state.log_history[-1],
                engine=type(engine).__name__,
                bare=engine.module is trainer.model,
                hooks=len(offload.forward_hooks),
            )
            for patch_id in ("zero3-unwrap", "grpo-eval-0.14"):
                trl_compat.revert(patch_id)
                try:
                    trainer.evaluate()
                    error = None
                except Exception as exc:  # noqa: BLE001 - reported, the test decides
                    error = f"{type(exc).__name__}: {exc}"
                finally:
                    trl_compat.install(patch_id)
                emit("without", patch=patch_id, error=error, hooks=len(offload.forward_hooks), status=trl_compat.status(patch_id))
            metrics = trainer.evaluate()
            emit("evaluated", metrics=metrics, last_log=train_state.log_history[-1], hooks=len(offload.forward_hooks))

    trainer = GRPOTrainer(
        model=model_dir,  # a path: under ZeRO-3 the model is loaded inside zero.Init
        reward_funcs=tiny.varying_reward,
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        eval_dataset=tiny.prompt_dataset(4),  # 2 prompts per rank: one evaluation batch each
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[Observer()],
    )
    state["trainer"] = trainer
    trainer.train()  # an error here kills the rank with TRL's traceback
    emit("trained", steps=trainer.state.global_step, observed=state["done"])
    finish()


if __name__ == "__main__":
    main()
