"""A ``PeftModel`` whose LoRA targets an ``nn.Parameter`` (``LoraConfig(target_parameters=...)``), trained by
GRPO with ``beta > 0``, and the log-probs its reference should have: for the two patches of a PeftModel's
reference adapter (peft-target-parameters-ref-adapter, peft-target-parameters-ref-copy).

The tiny Qwen2 has no MoE experts; ``target_parameters`` may name any ``nn.Parameter``: here each
layer's ``mlp.down_proj.weight`` (peft wraps it in a ``lora.ParamWrapper``, as it does fused expert
tensors). The adapter is built as a trained one would be (``init_lora_weights=False``: ``lora_B`` not
zero), so the base model and the adapter give different log-probs; seeded without touching the global RNG.

``run(tmp_path, model)`` trains one GRPO step and records, at the loss's call, the log-probs of the
batch's completions computed here (a plain forward of prompt + completion, no TRL code): with the
adapter (the policy at that step), with the adapter disabled (the base model), and TRL's own
``ref_per_token_logps``; and TRL's logged ``kl``.
"""

from __future__ import annotations

import dataclasses

import torch

import grpo_run
import tiny

TARGET_PARAMETERS = ["mlp.down_proj.weight"]
BETA = 0.1


def peft_model(seed: int = 0):
    """The tiny Qwen2 with a non-zero LoRA adapter ``"default"`` on each layer's ``mlp.down_proj.weight``."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=4, lora_alpha=8, target_modules=[], target_parameters=list(TARGET_PARAMETERS), init_lora_weights=False)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return get_peft_model(tiny.make_model("qwen2"), config)


def completion_logps(model, inputs) -> torch.Tensor:
    """Per-token log-probs of ``inputs``' completions under ``model`` as it is (temperature 1)."""
    prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
    logits = logits[:, prompt_ids.shape[1] - 1 : -1]
    return torch.log_softmax(logits, dim=-1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)


def k3(ref: torch.Tensor, policy: torch.Tensor, mask: torch.Tensor) -> float:
    """TRL's KL estimate ``exp(ref - policy) - (ref - policy) - 1``, its token mean over ``mask``."""
    diff = ref - policy
    per_token = torch.exp(diff) - diff - 1
    return float((per_token * mask).sum() / mask.sum())


@dataclasses.dataclass
class Step:
    trainer: object
    model: object  # the PeftModel trained
    trl_ref: torch.Tensor  # TRL's ref_per_token_logps
    adapter: torch.Tensor  # the policy's, computed here
    base: torch.Tensor  # adapter disabled, computed here
    mask: torch.Tensor
    kl: float  # TRL's logged kl
    weights_before: dict


def run(tmp_path, model=None, beta: float = BETA) -> Step:
    """One GRPO step on ``model`` (default: ``peft_model()``), the values above recorded at the loss's call."""
    model = peft_model() if model is None else model
    weights_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    trainer = grpo_run.make_trainer(tmp_path, model=model, steps=1, beta=beta)
    seen = []
    method = trainer.compute_loss

    def spy(wrapped, inputs, *args, **kwargs):
        peft_model_ = trainer.accelerator.unwrap_model(wrapped)
        adapter = completion_logps(peft_model_, inputs)
        with peft_model_.disable_adapter():
            base = completion_logps(peft_model_, inputs)
        seen.append((inputs["ref_per_token_logps"].detach().clone(), adapter, base, inputs["completion_mask"].float()))
        return method(wrapped, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    trainer.train()
    assert trainer.state.global_step == 1 and len(seen) == 1, (trainer.state.global_step, len(seen))
    trl_ref, adapter, base, mask = seen[0]
    kl = [h["kl"] for h in trainer.state.log_history if "kl" in h]
    assert len(kl) == 1, trainer.state.log_history
    return Step(trainer, model, trl_ref, adapter, base, mask, kl[0], weights_before)


def max_diff(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    return float(((a - b).abs() * mask).max())
