"""One rank of a real 2-process DeepSpeed ZeRO-3 GRPO run on the CPU, for tests/patches/test_zero3_unwrap.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_worker.py MODEL_DIR OUT_DIR``.
Whether trl_compat's ZeRO-3 patches are on is decided by the environment
(``TRL_COMPAT_DISABLE``); this script only observes and prints one line per
observation, ``Z3|{json}``, which the test parses. What it does, in order:

1. At ``on_train_begin`` (the engine exists, ``trainer.model`` is the bare
   module, ``trainer.model_wrapped`` the engine): how the parameters are
   sharded on this rank; whether the gathered weights equal the checkpoint;
   the ZeRO-3 hook count; then ``unwrap_model_for_generation`` on the engine
   without gathering (reference tokens), on the bare module, on the engine,
   on the engine with an exception raised inside the block and, where
   zero3-hooks-api is applied, on the bare module with that patch reverted.
   Each time: the hooks inside the block, the DeepSpeed fetches and
   all-gathers during ``generate``, the tokens, the error if any, the hooks
   afterwards. An unwrap that leaves the engine without hooks is reported and
   repaired so the next observation starts clean.
2. Real GRPO steps; every generation records the hooks and fetches while it runs.
3. After training: losses, whether the weights moved, hooks and sharding.

Errors of the unwrap calls are caught and reported (several observations per
launch keep the suite fast); an error in ``trainer.train()`` is not: the rank
dies with TRL's traceback and a non-zero exit status.
"""

import json
import math
import os
import sys

RANK = int(os.environ.get("RANK", "0"))


def emit(event, **fields):
    line = "Z3|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def skip_shm_build():
    """DeepSpeed's CPU accelerator JIT-compiles an optional shared-memory
    communication op on first use (over a minute on 2 cores); gloo works
    without it. ``import deepspeed.comm.torch as m`` would bind the torch
    package (deepspeed.comm re-exports ``torch``), hence sys.modules."""
    import deepspeed.comm.torch  # noqa: F401

    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None


ALLGATHERS = [0]


def serialise_all_gathers():
    """Count DeepSpeed's all-gathers and make each complete before the next starts.

    DeepSpeed 0.16's ``_allgather_params_coalesced`` (behind every
    ``GatheredParameters``, including the ones transformers uses to load a
    ZeRO-3 checkpoint) launches one async all-gather per parameter and waits
    only for the last ("ensures the operation is enqueued"): right for NCCL's
    in-order stream, not for gloo, whose worker threads can finish them out
    of order. On 2 CPU cores about one run in three then read uninitialised
    memory (weights of 1e38, NaN probabilities). Waiting at launch removes
    the race; it changes nothing else."""
    import deepspeed.comm as comm

    for name in ("all_gather_into_tensor", "all_gather", "allgather_fn"):
        original = getattr(comm, name, None)
        if original is None:
            continue

        def gather(*args, __original=original, **kwargs):
            ALLGATHERS[0] += 1
            handle = __original(*args, **kwargs)
            if kwargs.get("async_op") and handle is not None:
                handle.wait()
            return handle

        setattr(comm, name, gather)


def finish():
    """Wait for both ranks, say "done", and leave without the interpreter's teardown: gloo and
    DeepSpeed's CPU threads sometimes abort there ("terminate called without an active
    exception", SIGABRT) after everything has passed, which would fail the launch for nothing."""
    import torch.distributed

    torch.distributed.barrier()
    emit("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


DS_CONFIG = {
    "zero_optimization": {
        "stage": 3,
        # Tiny parameters would otherwise stay whole on every rank.
        "stage3_param_persistence_threshold": 0,
    },
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    # No "optimizer" block: the Trainer's torch AdamW (DeepSpeed's own compile C++ ops).
    "zero_allow_untested_optimizer": True,
}

MAX_NEW = 6


class Boom(Exception):
    pass


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    skip_shm_build()
    serialise_all_gathers()

    import trl_compat  # before trl, as a user would (the order does not matter)

    import deepspeed
    import torch
    import trl
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.models import utils as trl_utils

    import tiny

    statuses = {p.id: p.status for p in trl_compat.report() if p.id in ("zero3-unwrap", "zero3-hooks-api")}
    emit("versions", trl=trl.__version__, deepspeed=deepspeed.__version__, statuses=statuses)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args = GRPOConfig(
        output_dir=out_dir,
        deepspeed=DS_CONFIG,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,  # GRPOConfig's default 8 hits Trainer's no_sync, which ZeRO-3 refuses
        max_prompt_length=16,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
    )
    state = {}

    def unwrap():
        # Looked up at call time: whatever trl_compat bound (or not).
        return trl_utils.unwrap_model_for_generation

    def hooks():
        return len(state["offload"].forward_hooks)

    def shard_checksum(model):
        # This rank's own part of the weights: no collective needed.
        return float(sum(p.ds_tensor.detach().double().abs().sum() for p in model.parameters()))

    def shard_report(when, model):
        params = list(model.parameters())
        emit(
            "shard",
            when=when,
            params=len(params),
            local_numel=sum(p.numel() for p in params),  # 0 when partitioned
            shard_numel=sum(p.ds_tensor.numel() for p in params),  # this rank's part
            full_numel=sum(p.ds_numel for p in params),
            all_partitioned=all(p.ds_status.name == "NOT_AVAILABLE" for p in params),
        )

    def mismatched_with_checkpoint(model):
        """Names of gathered parameters that differ from the checkpoint on disk."""
        from safetensors.torch import load_file

        saved = load_file(os.path.join(model_dir, "model.safetensors"))
        named = dict(model.named_parameters())
        with deepspeed.zero.GatheredParameters(list(named.values())):
            return [n for n, p in named.items() if n not in saved or not torch.equal(saved[n], p.detach())]

    def count_ds_work():
        """Count DeepSpeed's per-submodule fetches (what the hooks do at every forward)."""
        offload = state["offload"]
        original_fetch = offload.pre_sub_module_forward_function

        def fetch(sub_module):
            state["fetches"] += 1
            return original_fetch(sub_module)

        offload.pre_sub_module_forward_function = fetch  # the hooks look it up on the instance
        state["fetches"] = 0

    def repair():
        offload = state["offload"]
        for hook in offload.forward_hooks + offload.backward_hooks:
            hook.remove()
        offload.forward_hooks, offload.backward_hooks = [], []
        register = getattr(offload, "_register_deepspeed_module", None) or offload._register_hooks_recursively
        register(offload.module)

    prompt = tokenizer(tiny.prompt_dataset(2)["prompt"], return_tensors="pt", padding=True)

    def observe(label, model, accelerator, raise_inside=False, **kwargs):
        info = {"label": label, "passed": "engine" if model is state["engine"] else "bare"}
        try:
            with unwrap()(model, accelerator, **kwargs) as unwrapped:
                info["hooks_inside"] = hooks()
                info["unwrapped_is_bare"] = unwrapped is state["bare"]
                if raise_inside:
                    raise Boom("raised inside unwrap_model_for_generation")
                state["fetches"] = ALLGATHERS[0] = 0
                with torch.no_grad():
                    out = unwrapped.generate(**prompt, max_new_tokens=MAX_NEW, do_sample=False, min_new_tokens=MAX_NEW)
                info["fetches"], info["allgathers"] = state["fetches"], ALLGATHERS[0]
                info["tokens"] = out[:, -MAX_NEW:].tolist()
            info["error"] = None
        except Boom as exc:
            info["error"] = f"Boom: {exc}"
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            info["error"] = f"{type(exc).__name__}: {exc}"
        info["hooks_after"] = hooks()
        emit("unwrap", **info)
        if info["hooks_after"] != state["baseline"]:
            repair()
            emit("repaired", label=label, hooks=hooks())

    class Observer(TrainerCallback):
        def on_train_begin(self, args, train_state, control, **kwargs):
            trainer = state["trainer"]
            engine, bare, accelerator = trainer.model_wrapped, trainer.model, trainer.accelerator
            state.update(engine=engine, bare=bare, offload=engine.optimizer.parameter_offload)
            state["baseline"] = hooks()
            emit(
                "engine",
                engine=type(engine).__name__,
                bare=type(bare).__name__,
                wraps_bare=engine.module is bare,
                bare_has_optimizer=hasattr(bare, "optimizer"),
                hooks=state["baseline"],
            )
            shard_report("begin", bare)
            emit("loaded", mismatched=mismatched_with_checkpoint(bare))
            count_ds_work()
            observe("reference", engine, accelerator, gather_deepspeed3_params=False)
            observe("bare", bare, accelerator)
            observe("engine", engine, accelerator)
            observe("raise", engine, accelerator, raise_inside=True)
            if trl_compat.status("zero3-hooks-api") == trl_compat.APPLIED:
                # zero3-unwrap alone must not hand TRL the engine when TRL could not
                # put the hooks back (DeepSpeed >= 0.16.4 without zero3-hooks-api).
                trl_compat.revert("zero3-hooks-api")
                try:
                    observe("bare_without_hooks_api", bare, accelerator)
                finally:
                    trl_compat.install("zero3-hooks-api")
                emit("reinstalled", status=trl_compat.status("zero3-hooks-api"))
            state["checksum_begin"] = shard_checksum(bare)

            original_generate = bare.generate

            def generate(*a, **k):  # GRPO generates on the unwrapped (bare) module
                hooks_during = hooks()
                state["fetches"] = 0
                out = original_generate(*a, **k)
                emit("grpo_generate", hooks_during=hooks_during, fetches=state["fetches"])
                return out

            bare.generate = generate

        def on_step_end(self, args, train_state, control, **kwargs):
            emit("step", step=train_state.global_step, hooks=hooks())

    trainer = GRPOTrainer(
        model=model_dir,  # a path: under ZeRO-3 the model must be loaded inside zero.Init
        reward_funcs=tiny.varying_reward,
        args=args,
        train_dataset=tiny.prompt_dataset(16),
        processing_class=tokenizer,
        callbacks=[Observer()],
    )
    state["trainer"] = trainer
    trainer.train()

    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    moved = abs(shard_checksum(trainer.model) - state["checksum_begin"])
    emit(
        "train",
        steps=trainer.state.global_step,
        losses=losses,
        finite=bool(losses) and all(math.isfinite(x) for x in losses),
        weights_moved=moved,
        hooks=hooks(),
    )
    shard_report("end", trainer.model)
    finish()


if __name__ == "__main__":
    main()
