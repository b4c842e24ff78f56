"""One rank of a 2-process DeepSpeed ZeRO-3 engine (CPU, gloo) whose weights TRL >= 1.11's server-mode
sync walks, for tests/patches/test_zero3_packed_sync.py.

Launched as ``python -m torch.distributed.run --nproc_per_node 2 tests/support/zero3_packed_sync_worker.py``.
TRL 1.11+ streams the weights to vLLM's server through vLLM's packed producer
(``VLLMClient.update_named_params`` -> ``packed_broadcast_producer``/``trainer_send_weights(packed=True)``),
fed by ``VLLMGeneration._iter_named_params``, which for a non-PEFT ZeRO-3 model yields
``param.data`` inside ``GatheredParameters([param])`` and leaves that gather at the next ``next()``.
vLLM's producer keeps a *view* of each yielded tensor (``.view(torch.uint8).view(-1)``) in a list
until its bucket is full, and only then ``torch.cat``s them: by then the earlier parameters have been
released. :func:`pack_chunks` is that producer without the broadcast. The worker runs TRL's real
``_iter_named_params`` (and ``DistributedBackend``) on a tiny Qwen2 whose every parameter is
partitioned (``stage3_param_persistence_threshold`` 0), with and without LoRA, and compares the
packed bytes with the same parameters gathered all at once and copied. A control overwrites each
gathered storage when its gather is left, as a release that reused the memory would: the comparison
then fails. One line per observation (``Z3|{json}``):

* ``packed``: per variant (``plain``, ``peft`` with 4 KiB buckets, ``plain-default-bucket``,
  ``peft-default-bucket`` with vLLM's 1 GiB, ``control``): the tensors and chunks packed, the names
  whose bytes differ from the whole-model gather (and how many in the last chunk), the LoRA-targeted
  names in the last chunk, the parameters' local sizes after the walk.
"""

import sys
from types import SimpleNamespace

from zero3_worker import emit, finish, serialise_all_gathers, skip_shm_build

DS_CONFIG = {
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
    "train_micro_batch_size_per_gpu": 1,
    "zero_allow_untested_optimizer": True,
}
DEFAULT_BUCKET_BYTES = 1024**3  # vLLM's DEFAULT_PACKED_BUFFER_SIZE_BYTES
BUCKET_BYTES = 4096  # vLLM's default is 1 GiB: small here so that every bucket spans several released parameters


def pack_chunks(iterator, post_iter_func, bucket_bytes=BUCKET_BYTES):
    """vLLM's ``packed_nccl_broadcast_producer`` without the broadcast (its ``pack_tensors``, step by
    step): ``[(names, packed), ...]``. A chunk's ``torch.cat`` runs once its size passes
    ``bucket_bytes`` or once the iterator is exhausted: the last chunk after the generator has finished."""
    import torch

    chunks = []
    while True:
        names, tensors, total = [], [], 0
        while True:
            try:
                item = next(iterator)
            except StopIteration:
                break
            tensors.append(post_iter_func(item).contiguous().view(torch.uint8).view(-1))
            names.append(item[0])
            total += tensors[-1].numel()
            if total > bucket_bytes:
                break
        if not tensors:
            return chunks
        chunks.append((names, torch.cat(tensors, dim=0)))


def main():
    skip_shm_build()
    serialise_all_gathers()

    import deepspeed
    import torch
    import trl
    from peft import LoraConfig, get_peft_model
    from trl.distributed import DistributedBackend
    from trl.generation.vllm_generation import VLLMGeneration

    import grpo_run
    import tiny

    deepspeed.init_distributed("gloo")
    torch.manual_seed(0)
    accelerator = SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=3), fsdp_plugin=None))

    def engine(peft):
        model = tiny.make_model("qwen2")  # deepspeed.initialize partitions it (ZeRO-Init would skip transformers' init)
        if peft:
            # lora_B random, not zero: merging changes the weights, as it does after any training step
            config = LoraConfig(r=4, target_modules=list(grpo_run.LORA_TARGETS), task_type="CAUSAL_LM", init_lora_weights=False)
            model = get_peft_model(model, config)
        params = [p for p in model.parameters() if p.requires_grad]
        eng, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(params, lr=0.1), config=DS_CONFIG)
        return eng.module

    def generation(model):
        gen = VLLMGeneration.__new__(VLLMGeneration)  # only what _iter_named_params reads
        gen.model, gen._dist = model, DistributedBackend(accelerator)
        return gen

    def expected(gen):
        with deepspeed.zero.GatheredParameters(list(gen.model.parameters())):
            return {n: t.detach().clone().view(torch.uint8).view(-1) for n, t in VLLMGeneration._iter_named_params(_whole(gen))}

    def observe(variant, gen, walk, bucket_bytes=BUCKET_BYTES):
        want = expected(gen)
        chunks = pack_chunks(walk(gen), lambda item: item[1], bucket_bytes)
        got = {}
        for names, packed in chunks:
            offset = 0
            for name in names:
                got[name] = packed[offset : offset + want[name].numel()]
                offset += want[name].numel()
            assert offset == packed.numel(), (names, offset, packed.numel())
        last = set(chunks[-1][0])
        differing = sorted(n for n in want if not torch.equal(got[n], want[n]))
        emit(
            "packed",
            variant=variant,
            trl=trl.__version__,
            deepspeed=deepspeed.__version__,
            names=len(got),
            expected_names=len(want),
            chunks=len(chunks),
            differing=differing,
            differing_in_last_chunk=sum(n in last for n in differing),
            lora_targets_in_last_chunk=sorted(n for n in last if n.rsplit(".", 2)[-2] in grpo_run.LORA_TARGETS),
            released=sorted({p.data.numel() for p in gen.model.parameters()}),
        )

    plain = generation(engine(peft=False))
    observe("plain", plain, VLLMGeneration._iter_named_params)
    peft = generation(engine(peft=True))
    observe("peft", peft, VLLMGeneration._iter_named_params)
    # vLLM's default bucket (1 GiB): the whole tiny model is one chunk, packed after the walk has ended
    observe("peft-default-bucket", peft, VLLMGeneration._iter_named_params, DEFAULT_BUCKET_BYTES)
    observe("plain-default-bucket", plain, VLLMGeneration._iter_named_params, DEFAULT_BUCKET_BYTES)
    observe("control", plain, _overwritten_on_release)
    finish()


def _whole(gen):
    """``gen`` with gathering switched off (the caller holds the whole model gathered)."""
    from contextlib import nullcontext

    from trl.generation.vllm_generation import VLLMGeneration

    whole = VLLMGeneration.__new__(VLLMGeneration)
    whole.model = gen.model
    whole._dist = SimpleNamespace(is_fsdp=False, fsdp_version=None, gather_params=lambda params: nullcontext())
    return whole


def _overwritten_on_release(gen):
    """``gen``'s walk with a release that overwrites the gathered storage in place (zeros) before
    DeepSpeed's own: what a stale view would read. The control that shows the comparison can fail."""
    from contextlib import contextmanager

    from trl.generation.vllm_generation import VLLMGeneration

    real = gen._dist

    @contextmanager
    def gather_params(params):
        with real.gather_params(params):
            yield
            for param in params:
                param.data.zero_()

    control = VLLMGeneration.__new__(VLLMGeneration)
    control.model = gen.model
    control._dist = SimpleNamespace(is_fsdp=False, fsdp_version=None, gather_params=gather_params)
    return VLLMGeneration._iter_named_params(control)


if __name__ == "__main__":
    sys.exit(main())
