"""A ``PeftModel`` whose LoRA adapter targets ``nn.Parameter``s (``LoraConfig(target_parameters=...)``,
peft >= 0.17: LoRA on the fused expert tensors of transformers 5's MoE layers), and whether the
installed peft lets a second such adapter sit beside it.

TRL keeps the reference of a ``PeftModel`` it is given as a second adapter, ``"ref"``, a frozen copy
of ``"default"`` (``add_adapter("ref", model.peft_config["default"])``, TRL 0.27.0 on). peft 0.17.1 -
0.19.x refuse a second LoRA adapter with ``target_parameters`` in ``LoraModel._create_and_replace``
(peft PR #2710; peft issue #3340); peft 0.20.0 (PR #3350) accepts one that targets the same
parameters, which a copy of ``"default"``'s config does. peft 0.17.0 has no refusal.
"""

from __future__ import annotations

from typing import Any

from trl_compat._helpers.models import is_peft_model
from trl_compat._helpers.source import code

# peft 0.17.1 - 0.19.x, LoraModel._create_and_replace: any other adapter's config with target_parameters
# makes it raise "... only one LoRA adapter per model with `target_parameters` is allowed."
REFUSAL = "conf.target_parameters for key, conf in self.peft_config.items() if key != adapter_name"


def target_parameters_config(model: Any) -> Any:
    """The ``"default"`` adapter's ``LoraConfig`` of ``model`` where it sets ``target_parameters``; else None."""
    if not is_peft_model(model):
        return None
    configs = getattr(model, "peft_config", None)
    config = configs.get("default") if isinstance(configs, dict) else None
    if config is None or not getattr(config, "target_parameters", None):
        return None
    from peft import LoraConfig

    return config if isinstance(config, LoraConfig) else None


def refuses_a_second_target_parameters_adapter() -> bool:
    """The installed peft's LoRA refuses a second adapter with ``target_parameters`` (0.17.1 - 0.19.x).
    Raises ``SourceUnavailable`` where its code cannot be read, ``ImportError`` without peft's LoRA."""
    from peft.tuners.lora.model import LoraModel

    return REFUSAL in code(LoraModel._create_and_replace)
