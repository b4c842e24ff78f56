"""One rank of a 2-process FSDP2 model with ``ignored_params`` on the CPU (gloo), for
tests/patches/test_fsdp2_ignored_params_sync.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/fsdp2_ignored_worker.py MODEL_DIR``.
Whether fsdp2-ignored-params-sync is on is decided by the environment (``TRL_COMPAT_DISABLE``); this
script prints one line per observation, ``FI|{json}``, which the test parses.

The tiny Qwen2 is sharded as accelerate's ``fsdp_version: 2`` shards it (``fully_shard`` on each
decoder layer, then on the root), the root told to ignore the final norm (``ignored_params``, as
accelerate's ``ignored_modules`` does): its weight stays a plain tensor on every rank. TRL's real
FSDP2 weight sync of the installed release is then run on it, with recorders for what vLLM would
receive (TRL issue #6622's reproduction, on 2 ranks):

- 1.11+: the generator ``VLLMGeneration._iter_fsdp2_params`` (what ``sync_weights`` streams);
- 0.28 - 1.10: ``VLLMGeneration._sync_fsdp2_params_to_vllm``, its ``_push_param_to_vllm`` recorded;
- 0.20 - 0.27: ``GRPOTrainer._sync_fsdp2_params_to_vllm`` in colocate mode, ``load_weights`` recorded.

Each received tensor is compared by value with the model's full weights.
"""

import json
import os
import sys
from types import SimpleNamespace

RANK = int(os.environ.get("RANK", "0"))
PATCH_ID = "fsdp2-ignored-params-sync"


def emit(event, **fields):
    line = "FI|" + json.dumps({"rank": RANK, "event": event, **fields}, default=str) + "\n"
    sys.stdout.flush()
    os.write(1, line.encode())  # one write: the two ranks share the pipe


def run_sync(grpo, model, received):
    """TRL's FSDP2 sync of this release on ``model``; what it sends is added to ``received``."""
    from fsdp2_worker import RecordingLLM

    generation = getattr(grpo, "VLLMGeneration", None)
    accelerator = SimpleNamespace(device=__import__("torch").device("cpu"), is_main_process=RANK == 0)
    if generation is not None and hasattr(generation, "_iter_fsdp2_params"):
        sync = object.__new__(generation)  # no vLLM is started: only the walk is run
        sync.accelerator = accelerator
        for name, tensor in sync._iter_fsdp2_params(model):
            received.add(name, tensor)
        return "VLLMGeneration._iter_fsdp2_params"
    if generation is not None and hasattr(generation, "_sync_fsdp2_params_to_vllm"):
        sync = object.__new__(generation)
        sync.accelerator = accelerator
        sync._push_param_to_vllm = received.add
        sync._sync_fsdp2_params_to_vllm(model)
        return "VLLMGeneration._sync_fsdp2_params_to_vllm"
    trainer = object.__new__(grpo.GRPOTrainer)
    trainer.accelerator, trainer.vllm_mode = accelerator, "colocate"
    trainer.llm = llm = RecordingLLM()
    trainer._sync_fsdp2_params_to_vllm(model)
    received.items.extend(llm.received.items)
    return "GRPOTrainer._sync_fsdp2_params_to_vllm"


def main():
    model_dir = sys.argv[1]

    import trl_compat  # before trl, as a user would

    import torch
    import torch.distributed
    import trl
    import trl.trainer.grpo_trainer as grpo
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    from fsdp2_worker import Received, cpu_stands_in_for_cuda

    cpu_stands_in_for_cuda(torch)  # TRL < 1.11 moves CPU tensors to "cuda" before gathering them
    torch.distributed.init_process_group("gloo")
    emit("versions", trl=trl.__version__, status=trl_compat.status(PATCH_ID))

    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh, ignored_params=set(model.model.norm.parameters()))
    expected = {}
    for name, value in model.state_dict().items():
        expected[name] = (value.full_tensor() if isinstance(value, DTensor) else value).detach().clone()
    plain = sorted(n for n, v in model.state_dict().items() if not isinstance(v, DTensor))

    received, error = Received(), None
    try:
        path = run_sync(grpo, model, received)
    except Exception as exc:  # noqa: BLE001 - reported, the test decides
        path, error = None, f"{type(exc).__name__}: {exc}"
    got = dict(received.items)
    emit(
        "sync",
        path=path,
        error=error,
        plain=plain,
        names=[n for n, _ in received.items],
        expected=sorted(expected),
        equal=sorted(n for n, t in got.items() if n in expected and torch.equal(t, expected[n])),
        unequal=sorted(n for n, t in got.items() if n in expected and not torch.equal(t, expected[n])),
        dtensors=sorted(n for n, t in got.items() if isinstance(t, DTensor)),
        methods_restored=not any(k in vars(model) for k in ("state_dict", "named_parameters")),
    )
    torch.distributed.barrier()
    emit("done")
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # gloo's threads sometimes abort in the interpreter's teardown


if __name__ == "__main__":
    main()
