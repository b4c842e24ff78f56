"""The values of the fixes that compute tensors outside the loss, on CUDA in bf16 against the CPU in float32.

none-reward-baseline's advantages (TRL's rewards are float32 on the device in every run) and the LoRA
merge the vLLM weight sync sends (trl_compat/_helpers/vllm_sync/merge.py, in the model's bf16). The
fixes inside the loss are held to the CPU by test_grpo_cuda.py's replay.
"""

import pytest

torch = pytest.importorskip("torch")

from trl_compat._helpers.vllm_sync import merge
from trl_compat.patches import none_reward_baseline

from tiny import make_model


def rewards_per_func(device):
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(16, 2, generator=generator) * 3
    rewards[[1, 6, 11]] = float("nan")  # every function declined these completions
    rewards[4, 0] = float("nan")  # one function declined this one
    return rewards.to(device)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_none_reward_baseline_advantages_agree_with_the_cpu(device, scale, aggregation):
    """none-reward-baseline"""
    on, _ = device
    weights = torch.tensor([1.0, 0.5])  # TRL keeps reward_weights on the CPU: the fix moves them
    expected = none_reward_baseline.baseline_free_advantages(rewards_per_func("cpu"), weights, 4, scale, aggregation)
    got = none_reward_baseline.baseline_free_advantages(rewards_per_func(on), weights, 4, scale, aggregation)
    assert got.device.type == on.type and got.dtype == torch.float32
    torch.testing.assert_close(got.cpu(), expected, atol=1e-5, rtol=1e-5)
    assert bool((got[[1, 6, 11]] == 0).all())


def lora_model(on, dtype):
    peft = pytest.importorskip("peft")
    model = make_model("qwen2", seed=0)
    config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = peft.get_peft_model(model, config)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:  # PEFT starts B at zero (nothing to merge) and A from the global RNG
                param.copy_(torch.randn(param.shape, generator=generator) * 0.05)
    return model.to(on, dtype)


def lora_layers(model):
    return [(name, module) for name, module in model.named_modules() if hasattr(module, "lora_A") and hasattr(module, "base_layer")]


def test_lora_merge_for_vllm_agrees_with_the_cpu_and_with_peft(device):
    """The LoRA merge the vLLM weight sync sends (vllm-merged-weights and the sync helpers)."""
    on, dtype = device
    reference = dict(lora_layers(lora_model("cpu", torch.float32)))
    layers = lora_layers(lora_model(on, dtype))
    assert layers
    for name, layer in layers:
        merged = merge.merged_weight(layer, ("default",), embedding=False)
        assert merged.device.type == on.type and merged.dtype == dtype, name
        # PEFT's own merge on a copy of the layer, on the same device in the same dtype: bit for bit
        assert torch.equal(merged, merge.copy_merged_state(layer, "")["weight"]), name
        expected = merge.merged_weight(reference[name], ("default",), embedding=False)
        torch.testing.assert_close(merged.float().cpu(), expected, atol=1e-2, rtol=1.6e-2)
