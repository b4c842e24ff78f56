"""When a ``GRPOTrainer`` is built: one WARNING (logger ``trl_compat``) per known bug that trl_compat
does not fix and that applies to this run, naming what ends it.

A static audit (``trl-compat audit``) sees the installed versions only; whether a bug bites also
depends on the run: ZeRO-3, FSDP, PEFT, liger, tools, vLLM's mode and sleep mode, several processes,
and the options users turn on that the ledger's opt-in records need (a vision-language model, paged
generation, OPSM, a reward model, ...: the ledger's ``when`` column,
:data:`trl_compat.ledger.CONDITIONS`). Here the bugs of the audit that trl_compat leaves unfixed and
that have such conditions are matched against the run's, read from the trainer's arguments, its
model, and the arguments TRL's ``GRPOTrainer.__init__`` was called with.
A bug without conditions is not repeated here: the audit names it.

Called by trl_compat's training callback when the trainer's ``__init__`` ends (the one place where
trl_compat acts at trainer construction without being a patch; see
:mod:`trl_compat._helpers.training_log`); its own errors never reach the run (``guarded``).
"""

from __future__ import annotations

import logging
import os
import sys
from types import FrameType
from typing import Any

from trl_compat._engine.fallback import guarded

LOGGER = logging.getLogger("trl_compat")
TRAINER_MODULE = "trl.trainer.grpo_trainer"
_warned: set[str] = set()  # once per bug and process, however many trainers it builds


def trainer_call() -> dict[str, Any]:
    """The arguments of the TRL ``GRPOTrainer.__init__`` call now running (``self`` included), or ``{}``."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "__init__" and frame.f_globals.get("__name__") == TRAINER_MODULE:
            return dict(frame.f_locals)
        frame = frame.f_back
    return {}


def run_conditions(args: Any, model: Any = None, call: dict[str, Any] | None = None) -> set[str]:
    """The :data:`~trl_compat.ledger.CONDITIONS` this run meets."""
    call = call or {}
    model = model if model is not None else call.get("model")
    return (
        _parallel_conditions(args, call.get("self"))
        | _peft_conditions(_peft_configs(model, call.get("peft_config")))
        | _generation_conditions(args, call)
        | _model_conditions(args, model, call)
        | _loss_conditions(args, call)
    )


def _parallel_conditions(args: Any, trainer: Any) -> set[str]:
    found = set()
    if _zero3(args, trainer):
        found.add("zero3")
    if found or getattr(args, "deepspeed", None) or getattr(trainer, "is_deepspeed_enabled", False):
        found.add("deepspeed")
    if getattr(args, "fsdp", None) or getattr(trainer, "is_fsdp_enabled", False):
        found.add("fsdp")
    if (getattr(args, "world_size", 1) or 1) > 1:
        found.add("multi_gpu")
    return found


def _peft_conditions(peft_configs: list[Any]) -> set[str]:
    found = {"peft"} if peft_configs else set()
    for config in peft_configs:
        if getattr(config, "use_dora", False):
            found.add("dora")
        if getattr(config, "target_parameters", None):
            found.add("peft_target_parameters")
        if _names_lm_head(getattr(config, "target_modules", None)) or _names_lm_head(getattr(config, "modules_to_save", None)):
            found.add("peft_lm_head")
        if getattr(config, "is_prompt_learning", False):
            found.add("peft_prompt_learning")
    return found


def _generation_conditions(args: Any, call: dict[str, Any]) -> set[str]:
    found = set()
    if call.get("tools") or call.get("environment_factory"):
        found.add("tools")
    if getattr(args, "use_transformers_paged", False):
        found.add("paged")
    if getattr(args, "use_vllm", False):
        found.add("vllm")
        mode = getattr(args, "vllm_mode", None) or ("server" if hasattr(args, "vllm_server_host") else "colocate")
        found.add("vllm_server" if mode == "server" else "vllm_colocate")
        if getattr(args, "vllm_enable_sleep_mode", False):
            found.add("vllm_sleep")
    # the option's name moved: vllm_guided_decoding_regex (TRL < 0.23), vllm_structured_outputs_regex
    if getattr(args, "vllm_structured_outputs_regex", None) or getattr(args, "vllm_guided_decoding_regex", None):
        found.add("structured_outputs")
    return found


def _model_conditions(args: Any, model: Any, call: dict[str, Any]) -> set[str]:
    found = set()
    config = getattr(model, "config", None)
    processor = call.get("processing_class")
    if getattr(config, "vision_config", None) is not None or getattr(processor, "image_processor", None) is not None:
        found.add("vlm")
    if getattr(args, "torch_compile", False) or hasattr(model, "_orig_mod"):
        found.add("torch_compile")
    if getattr(args, "cast_lm_head_to_fp32", False):
        found.add("lm_head_fp32")
    if getattr(args, "use_liger_kernel", False) or getattr(args, "use_liger_loss", False):
        found.add("liger")
    return found


def _loss_conditions(args: Any, call: dict[str, Any]) -> set[str]:
    found = set()
    if getattr(args, "beta", 0) or 0:
        found.add("kl")
    if getattr(args, "off_policy_mask_threshold", None) is not None:
        found.add("opsm")
    reward_funcs = call.get("reward_funcs")
    reward_funcs = reward_funcs if isinstance(reward_funcs, (list, tuple)) else [reward_funcs]
    # a reward model is named by its id or passed as a model; a reward function is a plain callable
    if any(isinstance(f, str) or hasattr(f, "config") for f in reward_funcs if f is not None):
        found.add("reward_model")
    return found


def _peft_configs(model: Any, passed: Any) -> list[Any]:
    """The PEFT configs of this run: the model's (a ``PeftModel``: ``{name: config}``) and the one passed."""
    configs = []
    held = getattr(model, "peft_config", None)
    if isinstance(held, dict):
        configs += list(held.values())
    elif held is not None:
        configs.append(held)
    if passed is not None:
        configs.append(passed)
    return configs


def _names_lm_head(modules: Any) -> bool:
    if isinstance(modules, str):
        return "lm_head" in modules
    return any("lm_head" in str(name) for name in modules or ())


def _zero3(args: Any, trainer: Any) -> bool:
    config = getattr(args, "hf_deepspeed_config", None)
    if config is not None and hasattr(config, "is_zero3"):
        return bool(config.is_zero3())
    plugin = getattr(getattr(getattr(trainer, "accelerator", None), "state", None), "deepspeed_plugin", None)
    if plugin is not None:
        return getattr(plugin, "zero_stage", None) == 3
    return os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE") == "3"


def warnings_for(conditions: set[str], statuses: dict[str, str] | None = None) -> list[dict]:
    """The audit's rows that trl_compat does not fix, whose ``when`` is set and all met."""
    from trl_compat.ledger import audit

    rows = audit.audit(statuses)["bugs"]
    return [r for r in rows if r["action"] in audit.UNFIXED and r["when"] and set(r["when"]) <= conditions]


def message(row: dict) -> str:
    head = f"trl_compat: known TRL bug {row['id']} applies to this run"
    if row["option"]:
        head = f"trl_compat: known TRL bug {row['id']} applies to this run if it uses {row['option']}"
    return f"{head}: {row['message']}"


def check(args: Any, model: Any = None, call: dict[str, Any] | None = None) -> list[str]:
    """Log one WARNING per unfixed bug this run meets (once per process); returns the ids warned about now."""
    warned: list[str] = []
    with guarded("ledger", "matching the run against the ledger's known bugs", "no warning about known bugs"):
        call = trainer_call() if call is None else call
        for row in warnings_for(run_conditions(args, model, call)):
            if row["id"] not in _warned:
                _warned.add(row["id"])
                warned.append(row["id"])
                LOGGER.warning("%s", message(row))
    return warned
