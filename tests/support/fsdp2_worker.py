"""One rank of a real 2-process FSDP2 GRPO run on the CPU (gloo), for tests/patches/test_fsdp2_vllm_sync.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/fsdp2_worker.py MODEL_DIR OUT_DIR [peft]``.
Whether fsdp2-vllm-sync is on is decided by the environment (``TRL_COMPAT_DISABLE``); this
script only observes and prints one line per observation, ``F2|{json}``, which the test parses.

The trainer is TRL's real ``GRPOTrainer``, built with ``use_vllm=False`` (no vLLM is needed to
construct or train it), then FSDP2-sharded the way accelerate's ``fsdp_version: 2`` does it
(``fully_shard`` on each decoder layer, then on the root) with ``trainer.is_fsdp_enabled`` set, as
transformers sets it under accelerate's FSDP plugin. (accelerate 1.8 turns FSDP on only for GPU-type
distributed setups, so on the CPU the sharding is applied here; what TRL's sync reads is the same.)
TRL's real ``_move_model_to_vllm`` is then called with what it reads from ``self`` in colocate mode
(``self.llm``, ``vllm_mode="colocate"``) and in server mode (``self.vllm_client``): recorders that
keep a copy of every (name, tensor) vLLM would receive.

1. Right after sharding: the sharding, then a colocate sync and a server sync, each compared by
   value with the full (unsharded) weights at that moment.
2. Two real GRPO steps: TRL's ``training_step`` (generation by the sharded model, rewards
   gathered across ranks, GRPO loss, backward through FSDP2) and an AdamW step on the shards.
3. After training: the same two syncs, and which weights moved since the start.
"""

import json
import math
import os
import sys

RANK = int(os.environ.get("RANK", "0"))
PATCH_ID = "fsdp2-vllm-sync"


def emit(event, **fields):
    line = "F2|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def finish():
    """Wait for both ranks, say "done", and leave without the interpreter's teardown (gloo's
    threads sometimes abort there after everything has passed)."""
    import torch.distributed

    torch.distributed.barrier()
    emit("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


class Received:
    """What a vLLM endpoint was given, in order; tensors copied on arrival."""

    def __init__(self):
        self.items = []
        self.resets = 0

    def add(self, name, tensor):
        self.items.append((name, tensor.detach().clone()))

    def reset_prefix_cache(self):
        self.resets += 1
        return True


class RecordingModel:
    """``...model_runner.model``: what TRL's colocate path calls ``load_weights`` on. With the vLLM
    stand-in installed, each call goes first to a stand-in model of the checkpoint's architecture
    (``engine``), which loads the weights or raises what vLLM raises for a name it does not know."""

    def __init__(self, received, engine=None):
        self.received = received
        self.engine = engine

    def load_weights(self, weights):
        weights = list(weights)
        if self.engine is not None:
            self.engine.load_weights(iter(weights))
        for name, tensor in weights:
            self.received.add(name, tensor)


class RecordingLLM:
    """Only the path TRL 0.18/0.19 take: ``llm_engine.model_executor.driver_worker.model_runner.model``."""

    def __init__(self, engine=None):
        self.received = Received()
        self.engine = engine
        runner = type("ModelRunner", (), {"model": RecordingModel(self.received, engine)})()
        worker = type("Worker", (), {"model_runner": runner})()
        executor = type("Executor", (), {"driver_worker": worker})()
        self.llm_engine = type("LLMEngine", (), {"model_executor": executor})()

    def reset_prefix_cache(self):
        return self.received.reset_prefix_cache()


class RecordingClient:
    """TRL's ``VLLMClient`` as the server path uses it."""

    def __init__(self):
        self.received = Received()

    def update_named_param(self, name, weights):
        self.received.add(name, weights)

    def reset_prefix_cache(self):
        self.received.reset_prefix_cache()


def standin_engine(model_dir):
    """A fresh stand-in vLLM model of the checkpoint's architecture (None without the stand-in)."""
    try:
        import vllm
        from vllm.model_executor.models import build_model
    except ImportError:
        return None
    if not getattr(vllm, "__stand_in__", False):
        return None
    import torch
    from transformers import AutoConfig

    return build_model(AutoConfig.from_pretrained(model_dir), torch.float32)


def cpu_stands_in_for_cuda(torch):
    """TRL >= 0.20's FSDP2 sync moves CPU shards to ``torch.device("cuda")`` before gathering them;
    this machine has no CUDA, so such moves keep the tensor where it is (the gather runs on gloo)."""
    if torch.cuda.is_available():
        return
    original = torch.Tensor.to

    def to(self, *args, **kwargs):
        target = args[0] if args else kwargs.get("device")
        if (isinstance(target, torch.device) and target.type == "cuda") or (isinstance(target, str) and target.startswith("cuda")):
            return self
        return original(self, *args, **kwargs)

    torch.Tensor.to = to


class Fsdp2Plugin:
    """What TRL >= 0.20 reads of accelerate's FSDP plugin to choose its FSDP2 sync."""

    fsdp_version = 2


def main():
    model_dir, out_dir = sys.argv[1], sys.argv[2]
    use_peft = len(sys.argv) > 3 and sys.argv[3] == "peft"

    import trl_compat  # before trl, as a user would (the order does not matter)

    import accelerate
    import torch
    import trl
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard
    from torch.distributed.tensor import DTensor
    from trl import GRPOConfig, GRPOTrainer

    import tiny

    cpu_stands_in_for_cuda(torch)
    emit(
        "versions", trl=trl.__version__, torch=torch.__version__, accelerate=accelerate.__version__, status=trl_compat.status(PATCH_ID)
    )

    tokenizer = tiny.make_tokenizer()  # as tests/support/grpo_run.py (from_pretrained loses settings on transformers 5)
    args = GRPOConfig(
        output_dir=out_dir,
        per_device_train_batch_size=2,
        num_generations=2,
        gradient_accumulation_steps=1,
        max_prompt_length=16,
        max_completion_length=8,
        max_steps=2,
        learning_rate=1e-2,
        beta=0.0,  # no reference model: the one model under test is the policy
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        bf16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        use_vllm=False,  # built and trained without vLLM; the syncs below are driven by hand
    )
    peft_config = None
    if use_peft:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    state = {}

    def full_weights(module):
        """The whole weights, as ``state_dict()`` names them (collective)."""
        out = {}
        for name, value in module.state_dict().items():
            if isinstance(value, DTensor):
                value = value.full_tensor()
            out[name] = value.detach().clone()
        return out

    def merged_base_weights(module):
        """What a plain model of the base architecture would hold: LoRA merged (collective)."""
        full = full_weights(module)
        if not use_peft:
            return full
        out = {}
        for name, value in full.items():
            if "lora_" in name:
                continue
            base = name.removeprefix("base_model.model.").replace(".base_layer", "")
            if name.endswith(".base_layer.weight"):
                stem = name[: -len("base_layer.weight")]
                a, b = full[stem + "lora_A.default.weight"], full[stem + "lora_B.default.weight"]
                value = value + (b @ a) * (8 / 4)
            out[base] = value
        return out

    def sync(label, mode):
        trainer = state["trainer"]
        expected = merged_base_weights(trainer.model)
        saved = trainer.vllm_mode, getattr(trainer, "llm", None), getattr(trainer, "vllm_client", None)
        trainer.vllm_mode = mode
        engine = None
        if mode == "colocate":
            engine = standin_engine(model_dir)
            endpoint = trainer.llm = RecordingLLM(engine)
        else:
            endpoint = trainer.vllm_client = RecordingClient()
        error = None
        accelerator_state = trainer.accelerator.state
        saved_plugin = getattr(accelerator_state, "fsdp_plugin", None)
        accelerator_state.fsdp_plugin = Fsdp2Plugin()  # accelerate's fsdp_version: 2, for the sync only
        try:
            trainer._move_model_to_vllm()
        except Exception as exc:  # noqa: BLE001 - reported, the test decides
            error = f"{type(exc).__name__}: {exc}"
        finally:
            accelerator_state.fsdp_plugin = saved_plugin
        trainer.vllm_mode, trainer.llm, trainer.vllm_client = saved
        held = {n: t.detach().float() for n, t in engine.hf_state_dict().items()} if engine is not None and error is None else None
        received = endpoint.received
        names = [n for n, _ in received.items]
        got = dict(received.items)
        emit(
            "sync",
            label=label,
            mode=mode,
            error=error,
            names=names,
            resets=received.resets,
            is_main=bool(trainer.accelerator.is_main_process),
            expected=sorted(expected),
            equal=sorted(n for n, t in got.items() if n in expected and torch.equal(t, expected[n])),
            unequal=sorted(n for n, t in got.items() if n in expected and not torch.equal(t, expected[n])),
            shapes={n: list(t.shape) for n, t in got.items()},
            dtensors=sorted(n for n, t in got.items() if isinstance(t, DTensor)),
            engine_equal=None
            if held is None
            else sorted(n for n in expected if n in held and torch.equal(held[n], expected[n].float())),
            engine_names=None if held is None else sorted(held),
        )
        return expected

    def shard(trainer):
        """FSDP2 as accelerate's ``fsdp_version: 2`` applies it: each decoder layer, then the root."""
        model = trainer.model
        mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
        for layer in [m for m in model.modules() if type(m).__name__ == "Qwen2DecoderLayer"]:
            fully_shard(layer, mesh=mesh)
        # Under PEFT the root group is the base model: TRL's non-vLLM generation calls
        # PeftModel.generate, which never runs the PeftModel's forward (FSDP2's root unshard hook).
        fully_shard(model.get_base_model() if use_peft else model, mesh=mesh)
        trainer.model_wrapped = model
        trainer.is_fsdp_enabled = True  # what transformers sets when accelerate has an FSDP plugin

    def report_sharding(model):
        params = dict(model.named_parameters())
        emit(
            "sharded",
            model=type(model).__name__,
            is_fsdp2=isinstance(model, FSDPModule),
            fsdp2_modules=sum(isinstance(m, FSDPModule) for m in model.modules()),
            params=len(params),
            dtensor_params=sum(isinstance(p, DTensor) for p in params.values()),
            local_numel=sum(p.to_local().numel() if isinstance(p, DTensor) else p.numel() for p in params.values()),
            full_numel=sum(p.numel() for p in params.values()),
        )

    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=tiny.varying_reward,
        args=args,
        train_dataset=tiny.prompt_dataset(16),
        processing_class=tokenizer,
        peft_config=peft_config,
    )
    state["trainer"] = trainer
    shard(trainer)
    model = trainer.model
    report_sharding(model)
    state["begin"] = sync("begin", "colocate")
    sync("begin", "server")

    # Real GRPO steps: TRL's training_step (generation by the sharded model, rewards gathered
    # across ranks, GRPO loss, backward through FSDP2's reduce-scatter), then an optimizer step.
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    prompts = tiny.prompt_dataset(4)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer's loop; transformers 5's training_step reads it
    losses = []
    for step in range(2):
        row = prompts[2 * step + RANK]
        batch = [{"prompt": row["prompt"]}] * args.num_generations  # one GRPO group per rank
        losses.append(float(trainer.training_step(model, batch)))
        optimizer.step()
        optimizer.zero_grad()
        trainer.state.global_step += 1

    end = sync("end", "colocate")
    sync("end", "server")
    moved = sorted(n for n, t in end.items() if not torch.equal(t, state["begin"][n]))
    emit(
        "train",
        steps=trainer.state.global_step,
        losses=losses,
        finite=bool(losses) and all(math.isfinite(x) for x in losses),
        moved=moved,
    )
    finish()


if __name__ == "__main__":
    main()
