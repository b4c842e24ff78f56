"""vllm-lora-names / vllm-merged-weights / vllm-prefix-cache against a REAL vLLM engine (V0).

Runs where a real ``vllm`` (not the test stand-in) has a device: a CUDA GPU with a GPU build
(e.g. vLLM 0.7.2), or the CPU with a vLLM CPU build (the matrix cell ``vllm-cpu-real``:
vllm-cpu 0.8.5.post2, see ``matrix/vllm_cpu/``); skipped otherwise (``tests/support/real_vllm.py`` picks
the device). Same assertions as ``test_vllm_sync.py``:

* real vLLM rejects what TRL 0.14.0 sends (``There is no module or parameter named 'base_model'``);
* after trl_compat's sync, vLLM's own (packed) parameters hold exactly the merged weights, cast
  to vLLM's dtype, and the training model is bit-identical;
* a GRPO run with LoRA + ``use_vllm`` (TRL 0.14.0 / 0.15.0 only) completes 3 steps, vLLM holding
  the merged weights after each sync.

Run on a GPU box with e.g. ``pip install vllm==0.7.2 trl==0.15.0 peft==0.14.0`` then
``pytest tests/vllm_real/test_vllm_real.py``; on the CPU: ``tox -e vllm-cpu-real``.
"""

from __future__ import annotations

import copy
import importlib.metadata
import warnings

import pytest
import torch
import vllm

import real_vllm  # conftest.py's skip rule holds here

if real_vllm.V1:
    # TRL 0.14 / 0.15, whose bugs these are, ran vLLM 0.7 / 0.8 (V0); vLLM 0.10's V1 engine is compared
    # with the stand-in in test_vllm_standin_vs_real.py and driven by TRL 0.23 / 0.24 in the other files
    pytest.skip(f"vllm {vllm.__version__}: these tests prove the TRL 0.14 / 0.15 patches on a V0 engine", allow_module_level=True)

import trl_compat
from trl_compat._helpers import vllm_sync
from trl_compat._helpers.models import peel

import tiny

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# head_dim 64: vLLM's attention backends do not all take the tiny fixtures' 32
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
DEVICE = real_vllm.DEVICE


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.save_tiny(tmp_path_factory.mktemp("real-vllm") / "tiny", model=tiny.make_model("qwen2", **SHAPE))


@pytest.fixture(scope="module")
def llm(checkpoint):
    engine = vllm.LLM(model=checkpoint, **real_vllm.engine_kwargs())
    try:
        engine.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        pytest.skip(f"vllm {vllm.__version__}: no V0 driver_worker.model_runner.model (TRL 0.14/0.15's path)")
    return engine


def lora_model(seed=0, **kwargs):
    from peft import LoraConfig, get_peft_model

    base = tiny.make_model("qwen2", **SHAPE).to(DEVICE)
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, init_lora_weights=False, **kwargs))


def merged_reference(model):
    model = copy.deepcopy(peel(model, peft=False, fsdp=False))
    if not hasattr(model, "merge_and_unload"):  # full fine-tuning
        return model.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.merge_and_unload().state_dict()


vllm_held = real_vllm.held  # vLLM's packed Qwen2 parameters under Hugging Face names


def assert_holds(llm_model, config, expected):
    held = vllm_held(llm_model, config)
    for name, tensor in held.items():
        want = expected[name].to(device=tensor.device, dtype=tensor.dtype)
        assert torch.equal(tensor, want), (name, float((tensor.float() - want.float()).abs().max()))
    return held


def snapshot(model):
    return {n: (p, p.detach().clone(), p.data_ptr()) for n, p in model.named_parameters()}


def changed(model, snap):
    now = dict(model.named_parameters())
    return [n for n, (p, v, ptr) in snap.items() if now.get(n) is not p or p.data_ptr() != ptr or not torch.equal(p.detach(), v)]


def test_real_vllm_rejects_peft_names(llm):
    llm_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    with pytest.raises(ValueError, match=r"There is no module or parameter named 'base_model' in Qwen2ForCausalLM"):
        llm_model.load_weights(lora_model().state_dict().items())


@pytest.mark.parametrize("kind", ["lora", "bf16-lora", "dora", "full-ft"])
def test_real_vllm_holds_exactly_the_merged_weights(llm, kind):
    import types

    if kind == "full-ft":
        model = tiny.make_model("qwen2", seed=3, **SHAPE).to(DEVICE)
    elif kind == "bf16-lora":
        model = lora_model(seed=1).to(torch.bfloat16)
    else:
        model = lora_model(seed=2, use_dora=kind == "dora")
    expected = merged_reference(model)
    snap = snapshot(model)
    trainer = types.SimpleNamespace(model=model, llm=llm, accelerator=types.SimpleNamespace(is_main_process=True))
    assert vllm_sync.sync_trainer(trainer) is True
    assert changed(model, snap) == []
    llm_model = llm.llm_engine.model_executor.driver_worker.model_runner.model
    assert_holds(llm_model, model.config, expected)
    # and vLLM generates with them (smoke: the engine still works after the load)
    out = llm.generate(["zaza bebe"], vllm.SamplingParams(max_tokens=4, temperature=0.0), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) >= 1


def _trl_window():
    try:
        from packaging.version import Version

        version = Version(importlib.metadata.version("trl"))
    except importlib.metadata.PackageNotFoundError:
        return None
    return version if Version("0.14.0") <= version < Version("0.15.1") else None


def test_real_grpo_lora_vllm_three_steps(tmp_path, checkpoint):
    """TRL 0.14.0 / 0.15.0 + real vLLM + LoRA: 3 steps; vLLM holds the merged weights after each
    sync and the sync leaves the training parameters as they were."""
    version = _trl_window()
    if version is None:
        pytest.skip("needs TRL 0.14.0 or 0.15.0 (the affected releases)")
    from peft import LoraConfig
    from trl import GRPOConfig, GRPOTrainer

    assert trl_compat.status("vllm-lora-names" if version.release[:2] == (0, 14) else "vllm-merged-weights") == trl_compat.APPLIED, (
        trl_compat.report()
    )
    fields = set(GRPOConfig.__dataclass_fields__)
    kwargs = dict(
        output_dir=str(tmp_path / "out"),
        report_to="none",
        save_strategy="no",
        logging_steps=1,
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=2,
        max_prompt_length=16,
        max_completion_length=8,
        learning_rate=1e-3,
        seed=0,
        bf16=False,
        use_vllm=True,
        vllm_device="cuda:0" if DEVICE == "cuda" else "cpu",
        vllm_gpu_memory_utilization=0.2,
        vllm_dtype="float32",
    )
    args = GRPOConfig(**{k: v for k, v in kwargs.items() if k in fields})
    trainer = GRPOTrainer(
        model=checkpoint,
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=tiny.make_tokenizer(),
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=TARGETS, task_type="CAUSAL_LM"),
    )
    llm_model = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model
    records = []
    name = "compute_loss" if version.release[:2] == (0, 14) else "_prepare_inputs"
    original = getattr(trainer, name)

    def spy(*args, **kwargs):
        model = trainer.model
        expected, snap = merged_reference(model), snapshot(model)
        due = trainer.state.global_step != trainer._last_loaded_step
        try:
            return original(*args, **kwargs)
        finally:
            if due:
                records.append((trainer.state.global_step, expected, vllm_held(llm_model, model.config), changed(model, snap)))

    setattr(trainer, name, spy)
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 3
    assert [r[0] for r in records] == [1, 2]
    for _step, expected, held, moved in records:
        assert moved == []
        for key, tensor in held.items():
            assert torch.equal(tensor, expected[key].to(device=tensor.device, dtype=tensor.dtype)), key


def test_real_vllm_prefix_cache_outlives_load_weights_until_reset(checkpoint):
    """vllm-prefix-cache: real vLLM serves a cached prompt prefix computed by the old weights
    after load_weights (the bug), and the patch's reset after the sync removes it."""
    from trl_compat.patches.vllm_prefix_cache import _reset_prefix_cache

    # block_size=16 as on the GPU: with IPEX, vLLM's CPU default is 128 tokens, longer than the prompt
    engine = vllm.LLM(model=checkpoint, **real_vllm.engine_kwargs(enable_prefix_caching=True, block_size=16))
    try:
        llm_model = engine.llm_engine.model_executor.driver_worker.model_runner.model
    except AttributeError:
        pytest.skip(f"vllm {vllm.__version__}: no V0 driver_worker.model_runner.model (TRL 0.15's path)")
    prompt = " ".join(tiny.vocab_words()[:40])  # two full 16-token blocks before the last token
    params = vllm.SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)

    def next_token_logprobs():
        (out,) = engine.generate([prompt], params, use_tqdm=False)
        return {tok: lp.logprob for tok, lp in out.outputs[0].logprobs[0].items()}

    next_token_logprobs()  # fills the cache with the checkpoint's KV
    llm_model.load_weights(tiny.make_model("qwen2", seed=5, **SHAPE).state_dict().items())
    stale = next_token_logprobs()
    assert engine.reset_prefix_cache()
    fresh = next_token_logprobs()  # computed from scratch by the new weights
    assert stale != pytest.approx(fresh, abs=1e-4)  # the bug: old KV under the new weights

    llm_model.load_weights(tiny.make_model("qwen2", seed=6, **SHAPE).state_dict().items())
    import types

    _reset_prefix_cache(types.SimpleNamespace(llm=engine))  # what the patch does after each sync
    after_fix = next_token_logprobs()
    assert engine.reset_prefix_cache()
    assert after_fix == pytest.approx(next_token_logprobs(), abs=1e-5)
