"""The patches, one module (or a small package of parts) each. A new patch is one module here plus its tests."""

from trl_compat.patches import (
    dataloader_workers,
    fsdp2_vllm_sync,
    grpo_eval_014,
    logits_to_keep,
    logps_attention_mask,
    logps_temperature,
    pad_token,
    peft_gradient_checkpointing,
    peft_optional,
    resume_buffered_inputs,
    reward_model_zero3,
    train_sampler_signature,
    transformers5_import,
    transformers5_use_cache,
    transformers5_warnings_issued,
    vllm_double_bos,
    vllm_lora_names,
    vllm_merged_weights,
    vllm_prefix_cache,
    vllm_prompt_special_tokens,
    vllm_prompt_truncation,
    vllm_v1_engine,
    zero3_hooks_api,
    zero3_unwrap,
)

PATCHES = [
    transformers5_import.PATCH,
    transformers5_use_cache.PATCH,
    transformers5_warnings_issued.PATCH,
    peft_optional.PATCH,
    zero3_unwrap.PATCH,
    zero3_hooks_api.PATCH,
    logits_to_keep.PATCH,
    train_sampler_signature.PATCH,
    dataloader_workers.PATCH,
    grpo_eval_014.PATCH,
    vllm_lora_names.PATCH,
    vllm_merged_weights.PATCH,
    vllm_prefix_cache.PATCH,  # after vllm-merged-weights: it wraps the same method
    # 0.14.0: both wrap compute_loss (as does vllm-lora-names), each scoping hooks to TRL's log-prob calls
    logps_attention_mask.PATCH,
    logps_temperature.PATCH,  # 0.15: wraps _get_per_token_logps, above logits-to-keep
    pad_token.PATCH,  # wraps __init__: sets the pad token before TRL reads it
    peft_gradient_checkpointing.PATCH,  # wraps __init__: acts after it
    resume_buffered_inputs.PATCH,
    reward_model_zero3.PATCH,
    # the three wrap the same generation method; each corrects only its own part of vLLM's prompt
    vllm_prompt_truncation.PATCH,
    vllm_prompt_special_tokens.PATCH,
    vllm_double_bos.PATCH,
    vllm_v1_engine.PATCH,
    fsdp2_vllm_sync.PATCH,
]
