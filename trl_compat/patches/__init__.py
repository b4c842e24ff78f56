"""The patches, one module each. A new patch is one module here plus its tests."""

from trl_compat.patches import (
    fsdp2_vllm_sync,
    grpo_eval_014,
    logits_to_keep,
    peft_optional,
    train_sampler_signature,
    transformers5_grpo,
    transformers5_import,
    vllm_lora_names,
    vllm_merged_weights,
    vllm_prefix_cache,
    vllm_v1_engine,
    zero3_hooks_api,
    zero3_unwrap,
)

PATCHES = [
    transformers5_import.PATCH,
    transformers5_grpo.PATCH,
    peft_optional.PATCH,
    zero3_unwrap.PATCH,
    zero3_hooks_api.PATCH,
    logits_to_keep.PATCH,
    train_sampler_signature.PATCH,
    grpo_eval_014.PATCH,
    vllm_lora_names.PATCH,
    vllm_merged_weights.PATCH,
    vllm_prefix_cache.PATCH,  # after vllm-merged-weights: it wraps the same method
    vllm_v1_engine.PATCH,
    fsdp2_vllm_sync.PATCH,
]
