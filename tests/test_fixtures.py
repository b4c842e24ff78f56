"""Tests of the offline test fixtures: ``tiny.py``, ``grpo_run.py`` and the vLLM stand-in.

The stand-in tests skip unless ``pip install ./tests/vllm_standin`` was run in this venv; the
GRPO + vLLM run additionally skips where TRL has no colocated vLLM path (TRL >= 0.16).
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

import grpo_run
import tiny

STANDIN = grpo_run.standin_vllm_installed()
requires_peft = pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="peft is not installed")
requires_standin = pytest.mark.skipif(not STANDIN, reason="vLLM stand-in not installed (pip install ./tests/vllm_standin)")


# --------------------------------------------------------------------------------------------------
# tiny.py
# --------------------------------------------------------------------------------------------------
def test_tokenizer_round_trips_and_pads_left(tmp_path):
    tok = tiny.make_tokenizer()
    assert len(tok) == tiny.VOCAB_SIZE
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2)
    for prompt in tiny.prompt_dataset(8)["prompt"]:
        ids = tok(prompt).input_ids
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == prompt
    enc = tok(["baba bafe", "baba bafe baki bamo"], padding=True, return_tensors="pt")
    assert set(enc.keys()) == {"input_ids", "attention_mask"}  # no token_type_ids (TRL 0.14 generate)
    assert enc.input_ids[0, :2].tolist() == [tok.pad_token_id] * 2  # left padding
    assert enc.attention_mask[0].tolist() == [0, 0, 1, 1]
    assert tok.decode([tok.eos_token_id, 5], skip_special_tokens=True) == tiny.vocab_words()[2]

    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tiny.save_tiny(tmp_path / "m", "qwen2", tokenizer=tok))
    assert again.padding_side == "left"
    assert list(again.model_input_names) == ["input_ids", "attention_mask"]
    assert again("bele biva").input_ids == tok("bele biva").input_ids


# Texts the tests encode (prompts, a chat turn) and some they do not (unknown words, punctuation,
# newlines, runs of spaces, special tokens in the text), so "the same ids" is not only on easy text.
_ENCODED_TEXTS = [
    *tiny.prompt_dataset(4)["prompt"],
    "system user assistant baba",
    "bele  biva\nkaba,   xyzzy dofu!\t</s> <pad>tire<unk>",
    "",
]


@pytest.mark.parametrize("trust_remote_code", [None, True], ids=["default", "trust_remote_code"])
@pytest.mark.parametrize(
    "arch,make",
    [("qwen2", tiny.make_tokenizer), ("llama", tiny.make_llama3_tokenizer), ("qwen2", tiny.make_llama3_tokenizer)],
    ids=["qwen2", "llama-llama3", "qwen2-llama3"],
)
def test_saved_checkpoint_loads_its_own_tokenizer_through_autotokenizer(arch, make, trust_remote_code, tmp_path):
    """What vLLM (and the stand-in) do with a checkpoint: ``AutoTokenizer.from_pretrained(path)``.
    It must give the ids (and text) of the tokenizer as built. On transformers >= 5.14 a plain
    ``save_pretrained`` of a "qwen2" checkpoint loads as ``Qwen2Tokenizer`` instead, which encodes
    every word to nothing (``[]``), so prompts are empty (see ``tiny.save_tokenizer``)."""
    from transformers import AutoTokenizer

    built = make()
    path = tiny.save_tiny(tmp_path / f"ckpt-{arch}", arch, tokenizer=built)
    kwargs = {} if trust_remote_code is None else {"trust_remote_code": trust_remote_code}
    loaded = AutoTokenizer.from_pretrained(path, **kwargs)

    assert [loaded(t).input_ids for t in _ENCODED_TEXTS] == [built(t).input_ids for t in _ENCODED_TEXTS]
    assert [loaded(t, add_special_tokens=False).input_ids for t in _ENCODED_TEXTS] == [
        built(t, add_special_tokens=False).input_ids for t in _ENCODED_TEXTS
    ]
    # by value: "baba" and "bafe" are words 0 and 11 of vocab_words(), after the 3 specials
    # (llama3: after its 7 specials and 3 roles, with the BOS, id 3, first)
    assert loaded("baba bafe").input_ids == ([3, 14] if make is tiny.make_tokenizer else [3, 10, 21])
    ids = list(range(tiny.VOCAB_SIZE))
    assert loaded.decode(ids) == built.decode(ids)
    assert loaded.decode(ids, skip_special_tokens=True) == built.decode(ids, skip_special_tokens=True)
    assert len(loaded) == len(built) == tiny.VOCAB_SIZE
    special = ("pad_token_id", "eos_token_id", "bos_token_id", "unk_token_id")
    assert [getattr(loaded, name) for name in special] == [getattr(built, name) for name in special]
    assert loaded.padding_side == "left" and list(loaded.model_input_names) == ["input_ids", "attention_mask"]
    assert loaded.chat_template == built.chat_template
    assert type(loaded).__name__ != "Qwen2Tokenizer"


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_model_shape_and_determinism(arch, tmp_path):
    model = tiny.make_model(arch)
    cfg = model.config
    assert type(model).__name__ == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}[arch]
    assert tiny.head_dim_of(cfg) >= 32
    assert cfg.vocab_size == len(tiny.make_tokenizer())
    assert cfg.num_key_value_heads < cfg.num_attention_heads
    assert not cfg.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()
    # deterministic and does not consume the global RNG
    state = torch.random.get_rng_state()
    other = tiny.make_model(arch)
    assert torch.equal(state, torch.random.get_rng_state())
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    # loadable from disk
    from transformers import AutoModelForCausalLM

    path = tiny.save_tiny(tmp_path / arch, arch)
    loaded = AutoModelForCausalLM.from_pretrained(path)
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))


def test_varying_reward_varies():
    tok = tiny.make_tokenizer()
    model = tiny.make_model()
    enc = tok([tiny.prompt_dataset(1)["prompt"][0]] * 8, return_tensors="pt")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        out = model.generate(**enc, max_new_tokens=8, do_sample=True, pad_token_id=tok.pad_token_id)
    completions = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    rewards = tiny.varying_reward(prompts=[""] * 8, completions=completions)
    assert len(set(rewards)) > 1
    assert rewards == tiny.varying_reward([""] * 8, completions)  # deterministic
    conv = tiny.varying_reward(["p"], [[{"role": "assistant", "content": completions[0]}]])
    assert conv == rewards[:1]


# --------------------------------------------------------------------------------------------------
# vLLM stand-in
# --------------------------------------------------------------------------------------------------
def _packed(arch="qwen2", **overrides):
    from vllm.model_executor.models import build_model

    hf = tiny.make_model(arch, **overrides)
    return hf, build_model(hf.config, torch.float32)


@requires_standin
def test_standin_identity():
    import importlib.metadata
    import pathlib

    import vllm

    # ./tests/vllm_standin is vLLM 0.7.2 (TRL 0.14/0.15 cells); the same code as each vX.Y.Z of
    # ./tests/vllm_standin/ (0.8.5 for trl0.15.2-tf4.52.4 ... 0.28.0 for trl1.12.0-tf5.16.1)
    releases = {path.name[1:] for path in (pathlib.Path(__file__).parent / "vllm_standin").glob("v*")}
    assert importlib.metadata.version("vllm") in {"0.7.2"} | releases, releases
    assert vllm.__version__ == importlib.metadata.version("vllm")
    assert vllm.__stand_in__ is True
    from trl.import_utils import is_vllm_available

    assert is_vllm_available()
    # what TRL 0.14-0.19 import or patch
    from vllm import LLM, SamplingParams  # noqa: F401
    from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator  # noqa: F401
    from vllm.distributed.utils import StatelessProcessGroup  # noqa: F401
    from vllm.worker.worker import Worker

    assert callable(Worker._assert_memory_footprint_increased_during_profiling)
    import trl.trainer.grpo_trainer  # noqa: F401  (imports vllm at module level when available)


@requires_standin
def test_standin_module_layout_follows_its_version():
    """vLLM 0.11 added ``structured_outputs``, 0.12 removed ``GuidedDecodingParams`` and
    ``guided_decoding=`` (PR #29326), 0.14 removed ``vllm.utils.get_open_port`` (TRL PR #4883's table)."""
    import importlib
    import importlib.metadata

    from packaging.version import Version

    version = Version(importlib.metadata.version("vllm"))
    sampling_params = importlib.import_module("vllm.sampling_params")
    utils = importlib.import_module("vllm.utils")
    # the module as vLLM built it, without what trl_compat's patches may have added since
    has = lambda module, name: name in vars(module) and not hasattr(vars(module)[name], "__trl_compat_patch__")  # noqa: E731
    assert has(sampling_params, "GuidedDecodingParams") is (version < Version("0.12.0"))
    assert has(utils, "get_open_port") is (version < Version("0.14.0"))
    fields = set(sampling_params.SamplingParams.__dataclass_fields__)
    assert ("guided_decoding" in fields) is (version < Version("0.12.0"))
    assert ("structured_outputs" in fields) is (version >= Version("0.11.0"))
    if version >= Version("0.12.0"):
        with pytest.raises(TypeError, match="unexpected keyword argument 'guided_decoding'"):
            sampling_params.SamplingParams(guided_decoding=None)
    from vllm.utils.network_utils import get_open_port

    assert get_open_port() > 0


@requires_standin
@requires_peft
@pytest.mark.parametrize("arch,root", [("qwen2", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")])
def test_standin_rejects_peft_names(arch, root):
    import importlib.metadata

    from packaging.version import Version
    from peft import LoraConfig, get_peft_model

    hf, packed = _packed(arch)
    peft_model = get_peft_model(hf, LoraConfig(r=8, target_modules=grpo_run.LORA_TARGETS, task_type="CAUSAL_LM"))
    with pytest.raises(ValueError) as err:
        packed.load_weights(peft_model.state_dict().items())
    message = f"There is no module or parameter named 'base_model' in {root}"
    if Version(importlib.metadata.version("vllm")) >= Version("0.15.0"):  # and the parameters it has
        available = {name for name, _ in packed.named_parameters()}
        message += f". The available parameters belonging to  ({root}) are: {available}"
    assert str(err.value) == message
    assert packed.received_names[-1] == list(peft_model.state_dict().keys())
    # prefix stripped but .base_layer kept: vLLM's bare KeyError on the rewritten inner name
    with pytest.raises(KeyError) as err:
        packed.load_weights([("model.layers.0.self_attn.q_proj.base_layer.weight", torch.zeros(128, 128))])
    assert err.value.args == ("layers.0.self_attn.qkv_proj.base_layer.weight",)
    with pytest.raises(ValueError, match=r"^There is no module or parameter named 'lm_head.foo' in " + root):
        packed.load_weights([("lm_head.foo", torch.zeros(1))])


@requires_standin
@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_standin_loads_plain_state_dict(arch):
    hf, packed = _packed(arch)
    reference = hf.state_dict()
    assert packed.hf_state_dict().keys() == reference.keys()
    name = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(packed.hf_state_dict()[name], reference[name])  # not loaded yet
    loaded = packed.load_weights(reference.items())
    layers = range(hf.config.num_hidden_layers)
    expected = {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    for i in layers:
        p = f"model.layers.{i}."
        expected |= {
            p + "self_attn.qkv_proj.weight",
            p + "self_attn.o_proj.weight",
            p + "mlp.gate_up_proj.weight",
            p + "mlp.down_proj.weight",
            p + "input_layernorm.weight",
            p + "post_attention_layernorm.weight",
        }
        if arch == "qwen2":
            expected.add(p + "self_attn.qkv_proj.bias")
    assert loaded == expected
    got = packed.hf_state_dict()
    assert got.keys() == reference.keys()
    for name, tensor in reference.items():
        assert torch.equal(got[name], tensor), name
    # really packed: rows q, k, v and gate, up
    qkv = packed.model.layers[0].self_attn.qkv_proj.weight
    q, k = reference["model.layers.0.self_attn.q_proj.weight"], reference["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(qkv[: q.shape[0]], q) and torch.equal(qkv[q.shape[0] : q.shape[0] + k.shape[0]], k)
    assert qkv.shape[0] == q.shape[0] + 2 * k.shape[0]
    assert packed.model.layers[0].mlp.gate_up_proj.weight.shape[0] == 2 * hf.config.intermediate_size
    # rotary inv_freq is skipped silently
    assert packed.load_weights([("model.layers.0.self_attn.rotary_emb.inv_freq", torch.zeros(16))]) == set()


@requires_standin
def test_standin_skips_lm_head_when_tied():
    hf, packed = _packed("qwen2", tie_word_embeddings=True)
    sd = hf.state_dict()
    assert "lm_head.weight" in sd
    loaded = packed.load_weights(sd.items())
    assert "lm_head.weight" not in loaded and "model.embed_tokens.weight" in loaded
    assert torch.equal(packed.hf_state_dict()["lm_head.weight"], sd["model.embed_tokens.weight"])


@requires_standin
def test_standin_rejects_wrong_shapes():
    hf, packed = _packed("qwen2")
    sd = hf.state_dict()
    q = sd["model.layers.0.self_attn.q_proj.weight"]
    with pytest.raises(RuntimeError, match=r"start \(0\) \+ length \(128\) exceeds dimension size \(64\)"):
        packed.load_weights([("model.layers.0.self_attn.q_proj.weight", q[:64])])
    with pytest.raises(AssertionError):
        packed.load_weights([("model.layers.0.self_attn.q_proj.weight", q[:, :64])])
    with pytest.raises(
        AssertionError,
        match=r"Attempted to load weight \(torch.Size\(\[64\]\)\) into parameter "
        r"\(torch.Size\(\[128\]\)\)",
    ):
        packed.load_weights([("model.norm.weight", torch.ones(64))])
    with pytest.raises(AssertionError):  # vocab rows must match org_vocab_size
        packed.load_weights([("model.embed_tokens.weight", sd["model.embed_tokens.weight"][:500])])
    with pytest.raises(ValueError) as err:
        packed.load_weights([("lm_head.weight.x", torch.zeros(1))])
    assert str(err.value) == "Attempted to load nested weight 'lm_head.weight.x' into a single parameter 'lm_head.weight'"


@requires_standin
def test_standin_engine_choice(tmp_path, monkeypatch):
    """vLLM >= 0.8's V0/V1 choice (on a GPU), from the installed version's point of view."""
    import vllm
    from packaging.version import Version
    from vllm import LLM
    from vllm.engine.llm_engine import LLMEngine as V0

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    for name in ("VLLM_USE_V1", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        monkeypatch.delenv(name, raising=False)

    def built(**kwargs):
        return type(LLM(model=path, **kwargs).llm_engine)

    if Version(vllm.__version__) < Version("0.8.0"):  # V0 only, and os.environ left alone
        assert built() is V0 and built(dtype="float32") is V0 and "VLLM_USE_V1" not in os.environ
        return
    from vllm.v1.engine.llm_engine import LLMEngine as V1

    llm = LLM(model=path)  # float16 (dtype "auto"): V1, its engine core in another process
    assert type(llm.llm_engine) is V1 and os.environ["VLLM_USE_V1"] == "1"  # vLLM records its choice
    with pytest.raises(AttributeError, match=r"^'LLMEngine' object has no attribute 'model_executor'$"):
        llm.llm_engine.model_executor
    assert llm.generate("a b c", vllm.SamplingParams(max_tokens=2))[0].outputs[0].token_ids  # still generates
    del os.environ["VLLM_USE_V1"]
    assert built(dtype="float32") is V0 and os.environ["VLLM_USE_V1"] == "0"  # V1 runs float16/bfloat16 only
    monkeypatch.setenv("VLLM_USE_V1", "0")
    assert built() is V0
    monkeypatch.setenv("VLLM_USE_V1", "1")
    with pytest.raises(NotImplementedError, match=r"VLLM_USE_V1=1 is not supported with --dtype torch.float32"):
        built(dtype="float32")
    monkeypatch.delenv("VLLM_USE_V1")
    llm = LLM(model=path, distributed_executor_backend="external_launcher")  # TRL 0.18/0.19's colocate mode
    assert type(llm.llm_engine) is V1 and os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert llm.llm_engine.model_executor.driver_worker.model_runner.model is llm.model  # in-process core
    assert "self.model_executor =" in inspect.getsource(V0)  # the V0 class, where the probe looks


@requires_standin
def test_standin_llm_generates_with_loaded_weights(tmp_path):
    from packaging.version import Version
    from vllm import LLM, SamplingParams

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    state = torch.random.get_rng_state()
    # EngineArgs.device is gone from vLLM 0.10.0 (TRL 0.14 / 0.15 pass it, on vLLM 0.7 / 0.8)
    device = {"device": "cpu"} if _standin_version() < Version("0.10.0") else {}
    llm = LLM(model=path, gpu_memory_utilization=0.5, dtype="float32", enable_prefix_caching=True, **device)
    assert llm.model.received_names == []  # the checkpoint load at init is not recorded
    assert llm.llm_engine.model_executor.driver_worker.model_runner.model is llm.model
    if device:
        assert llm.engine_kwargs["device"] == "cpu"
    else:
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'device'"):
            LLM(model=path, device="cpu")
    assert LLM(model=path).dtype == torch.float16  # vLLM: "auto" runs float32 checkpoints in float16

    tok = tiny.make_tokenizer()
    prompt = tiny.prompt_dataset(1)["prompt"][0]
    prompt_ids = tok(prompt, return_tensors="pt").input_ids

    def hf_greedy(model):
        out = model.generate(prompt_ids, max_new_tokens=6, do_sample=False, pad_token_id=0, eos_token_id=1)
        ids = out[0, prompt_ids.shape[1] :].tolist()
        return ids[: ids.index(1) + 1] if 1 in ids else ids

    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    (out,) = llm.generate([prompt], sampling_params=greedy, use_tqdm=False)
    assert out.prompt == prompt and out.prompt_token_ids == prompt_ids[0].tolist()
    assert out.outputs[0].token_ids == hf_greedy(tiny.make_model("qwen2"))

    other = tiny.make_model("qwen2", seed=1)
    llm.model.load_weights(other.state_dict().items())
    (out2,) = llm.generate(prompt, greedy, use_tqdm=False)
    assert out2.outputs[0].token_ids == hf_greedy(other)
    assert out2.outputs[0].token_ids != out.outputs[0].token_ids

    outs = llm.generate([prompt, prompt], SamplingParams(n=3, temperature=1.0, max_tokens=8), use_tqdm=False)
    assert [len(o.outputs) for o in outs] == [3, 3]
    assert all(1 <= len(c.token_ids) <= 8 for o in outs for c in o.outputs)
    assert len({tuple(c.token_ids) for o in outs for c in o.outputs}) > 1
    assert torch.equal(state, torch.random.get_rng_state())  # never touches the caller's RNG
    with pytest.raises(TypeError):
        SamplingParams(not_a_field=1)


def _standin_version():
    import vllm
    from packaging.version import Version

    return Version(vllm.__version__)


@requires_standin
def test_standin_engine_args_follow_the_version(tmp_path):
    """``LLM(**kwargs)`` passes unknown names to vLLM's ``EngineArgs`` dataclass: a ``TypeError``;
    ``logprobs_mode`` is a field from vLLM 0.10.0 on."""
    from packaging.version import Version
    from vllm import LLM

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'not_an_engine_arg'"):
        LLM(model=path, not_an_engine_arg=1)
    colocate = dict(
        tensor_parallel_size=1,
        max_num_seqs=4,
        max_model_len=64,
        distributed_executor_backend="external_launcher",
        seed=0,
        max_num_batched_tokens=4096,
        model_impl="auto",
        enable_sleep_mode=False,
    )
    if _standin_version() < Version("0.10.0"):
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'logprobs_mode'"):
            LLM(model=path, logprobs_mode="processed_logprobs")
        return
    llm = LLM(model=path, logprobs_mode="processed_logprobs", **colocate)  # TRL 0.24 - 0.29's colocate call
    assert llm.logprobs_mode == "processed_logprobs" and LLM(model=path).logprobs_mode == "raw_logprobs"
    with pytest.raises(ValueError, match="logprobs_mode"):
        LLM(model=path, logprobs_mode="tempered")


@requires_standin
def test_standin_logprobs_raw_and_processed(tmp_path):
    """``SamplingParams(logprobs=k)``: per token ``{token_id: Logprob}``, the sampled token first; raw =
    log-softmax of the raw logits, processed = after the temperature from vLLM 0.10.2 (``logprobs_mode``)."""
    from packaging.version import Version
    from vllm import LLM, SamplingParams

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    prompt = tiny.prompt_dataset(1)["prompt"][0]
    tok = tiny.make_tokenizer()
    model = tiny.make_model("qwen2")
    modes = ["raw_logprobs"] + (["processed_logprobs"] if _standin_version() >= Version("0.10.0") else [])
    for mode in modes:
        kwargs = {"logprobs_mode": mode} if _standin_version() >= Version("0.10.0") else {}
        llm = LLM(model=path, dtype="float32", **kwargs)
        (out,) = llm.generate(prompt, SamplingParams(temperature=0.5, max_tokens=6, logprobs=0, seed=3), use_tqdm=False)
        completion = out.outputs[0]
        assert len(completion.logprobs) == len(completion.token_ids)
        assert [list(lp) for lp in completion.logprobs] == [[t] for t in completion.token_ids]
        ids = torch.tensor([out.prompt_token_ids + completion.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(out.prompt_token_ids) - 1 : -1].float()
        # vLLM 0.10.0 / 0.10.1's "processed" log-probs are taken before the temperature, 0.10.2's after it
        tempered = mode == "processed_logprobs" and _standin_version() >= Version("0.10.2")
        temperature = 0.5 if tempered else 1.0
        expected = torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion.token_ids)[:, None])[:, 0]
        got = torch.tensor([next(iter(lp.values())).logprob for lp in completion.logprobs])
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
        assert math.isclose(completion.cumulative_logprob, got.sum().item(), rel_tol=1e-5)
        ranks = [lp[t].rank for lp, t in zip(completion.logprobs, completion.token_ids)]
        assert ranks == [
            int((torch.log_softmax(row, -1) > torch.log_softmax(row, -1)[t]).sum()) + 1 for row, t in zip(logits, completion.token_ids)
        ]
        (top,) = llm.generate(prompt, SamplingParams(temperature=0.0, max_tokens=3, logprobs=2), use_tqdm=False)
        for lp, t in zip(top.outputs[0].logprobs, top.outputs[0].token_ids):
            assert next(iter(lp)) == t and lp[t].rank == 1 and len(lp) == 2  # greedy: the sampled token is the top 1
        assert tok.decode([completion.token_ids[0]]) == completion.logprobs[0][completion.token_ids[0]].decoded_token
    (plain,) = LLM(model=path, dtype="float32").generate(prompt, SamplingParams(max_tokens=2), use_tqdm=False)
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None


@requires_standin
def test_standin_sleep_wake_up_and_reload_weights(tmp_path):
    """Sleep mode: level 1 keeps the weights, level 2 leaves deterministic garbage that
    ``collective_rpc("reload_weights")`` replaces with the checkpoint; every call is recorded."""
    from vllm import LLM, SamplingParams

    path = tiny.save_tiny(tmp_path / "m", "qwen2")
    checkpoint = tiny.make_model("qwen2").state_dict()

    def weights(llm):
        return {k: v.float() for k, v in llm.model.hf_state_dict().items()}

    def same(a, b):
        return all(torch.equal(a[k], b[k]) for k in a)

    llm = LLM(model=path, dtype="float32", enable_sleep_mode=True)
    before = weights(llm)
    assert same(before, {k: checkpoint[k] for k in before})
    llm.sleep(level=1)
    with pytest.raises(RuntimeError, match="sleeps"):
        llm.generate("baba", SamplingParams(max_tokens=2))
    llm.wake_up()
    assert same(weights(llm), before) and llm.sleeping_tags == set()
    llm.sleep(level=2)
    garbage = weights(llm)
    assert not any(torch.equal(garbage[k], before[k]) for k in before)
    llm.wake_up(tags=["weights"])
    assert llm.sleeping_tags == {"kv_cache"}
    assert llm.collective_rpc("reload_weights") == [None]
    assert same(weights(llm), before)
    assert llm.model.received_names == []  # the loader's reload is not a weight sync
    llm.wake_up(tags=["kv_cache"])
    assert llm.generate("baba", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ids
    assert llm.engine_calls == [
        ("sleep", 1),
        ("generate", 1),
        ("wake_up", None),
        ("sleep", 2),
        ("wake_up", ["weights"]),
        ("collective_rpc", "reload_weights"),
        ("wake_up", ["kv_cache"]),
        ("generate", 1),
    ]
    again = LLM(model=path, dtype="float32", enable_sleep_mode=True)
    again.sleep(level=2)
    assert same(weights(again), garbage)  # deterministic
    off = LLM(model=path, dtype="float32")  # sleep mode off: nothing is released
    off.sleep(level=2)
    off.wake_up()
    assert same(weights(off), before)


@requires_standin
def test_standin_chat_applies_the_template_without_special_tokens(tmp_path):
    from vllm import LLM, SamplingParams

    path = tiny.save_tiny(tmp_path / "m", "llama")
    tok = tiny.make_llama3_tokenizer()
    tiny.save_tokenizer(path, tok)
    llm = LLM(model=path, dtype="float32")
    conversations = [[{"role": "user", "content": "baba bafe"}], [{"role": "user", "content": "baki"}]]
    outs = llm.chat(conversations, SamplingParams(max_tokens=2), use_tqdm=False, chat_template_kwargs={})
    texts = [tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True) for c in conversations]
    expected = [tok(t, add_special_tokens=False).input_ids for t in texts]
    assert [o.prompt_token_ids for o in outs] == expected and llm.received_prompt_ids == [expected]
    assert all(ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id for ids in expected)  # one BOS, the template's
    assert llm.received_chat_prompts == [texts] and llm.engine_calls == [("chat", 2)]
    (single,) = llm.chat(conversations[0], SamplingParams(max_tokens=2), use_tqdm=False, add_generation_prompt=False)
    assert (
        single.prompt_token_ids == tok(tok.apply_chat_template(conversations[0], tokenize=False), add_special_tokens=False).input_ids
    )


# --------------------------------------------------------------------------------------------------
# GRPO runs
# --------------------------------------------------------------------------------------------------
def _check_run(trainer, history, steps=3):
    losses = grpo_run.train_losses(history)
    assert len(losses) == steps, history
    assert all(math.isfinite(x) for x in losses)
    assert trainer.state.global_step == steps
    assert any(e.get("reward_std", 0) > 0 for e in history), "advantages would all be zero"
    changed = grpo_run.changed_trainable(trainer)
    assert changed, "no trainable weight changed"
    return changed


@pytest.mark.parametrize("arch", tiny.ARCHS)
def test_grpo_full_finetune_runs(arch, tmp_path):
    trainer, history = grpo_run.run_grpo(tmp_path, model=arch, steps=3)
    changed = _check_run(trainer, history)
    assert len(changed) == len(trainer.tiny_initial_trainable)  # every weight moved (lr 1e-3)
    # TRL 0.26 stopped truncating prompts and 0.28 dropped max_prompt_length; every other key exists everywhere
    assert set(trainer.tiny_dropped_config_keys) <= ({"max_prompt_length"} if grpo_run.trl_version() >= (0, 28) else set())


@requires_peft
def test_grpo_lora_runs(tmp_path):
    from accelerate.utils import is_peft_model

    trainer, history = grpo_run.run_grpo(tmp_path, model="qwen2", peft=True, steps=3)
    assert is_peft_model(trainer.model)
    changed = _check_run(trainer, history)
    assert changed and all("lora_" in n for n in trainer.tiny_initial_trainable)
    assert any("lora_B" in n for n in changed)


def test_grpo_accepts_model_instance(tmp_path):
    trainer = grpo_run.make_trainer(tmp_path, model=tiny.make_model("llama"), steps=1, beta=0.04)
    assert type(trainer.model).__name__ == "LlamaForCausalLM"


@requires_standin
def test_grpo_vllm_standin_run(tmp_path):
    if not grpo_run.has_colocated_vllm() and not grpo_run.has_colocate_mode():
        with pytest.raises(grpo_run.VLLMPathUnsupported):
            grpo_run.make_trainer(tmp_path, use_vllm=True)
        pytest.skip("installed TRL has no colocated vLLM path wired to the stand-in (TRL 0.16/0.17)")
    trainer, history = grpo_run.run_grpo(tmp_path, model="qwen2", use_vllm=True, steps=3)
    _check_run(trainer, history)
    llm = grpo_run.trainer_llm(trainer)
    packed = llm.model
    assert llm.generate_calls == 3
    # step 1 generates from the checkpoint; steps 2 and 3 push the trained weights first
    hf_names = set(trainer.model.state_dict().keys())
    if grpo_run.has_colocate_mode():
        # TRL 0.18/0.19 colocate: one load_weights call per parameter, and a sync before step 1 too
        assert len(packed.received_names) == 3 * len(hf_names)
        assert all(len(names) == 1 for names in packed.received_names)
        assert {names[0] for names in packed.received_names} == hf_names
    else:
        assert len(packed.received_names) == 2
        assert all(set(names) == hf_names for names in packed.received_names)
    assert all(loaded for loaded in packed.loaded_names)
    initial = tiny.make_model("qwen2").state_dict()
    pushed = packed.hf_state_dict()
    # (TRL 0.14 has no vllm_dtype: the stand-in then runs in float16, like vLLM's "auto")
    drift = max((pushed[k].float() - initial[k]).abs().max().item() for k in initial)
    assert drift > 5e-4, "vLLM never got the trained weights"


@requires_standin
@pytest.mark.skipif(not grpo_run.has_colocate_mode() or grpo_run.trl_version()[:2] < (0, 20), reason="TRL 0.20+'s colocate mode")
def test_grpo_vllm_colocate_0_2x_trains_on_standin_completions(tmp_path):
    """TRL 0.20 - 0.29.1, ``vllm_mode="colocate"`` on the stand-in: one real step, whose completions
    (and, from 0.23, their sampling log-probs) are the ones the stand-in returned."""
    trainer = grpo_run.make_trainer(tmp_path, model="qwen2", use_vllm=True, steps=1)
    llm = grpo_run.trainer_llm(trainer)
    from vllm.entrypoints.llm import LLM

    assert isinstance(llm, LLM) and llm.init_kwargs["distributed_executor_backend"] == "external_launcher"
    batches = []
    original = trainer._generate_and_score_completions

    def recording(*args, **kwargs):
        batch = original(*args, **kwargs)
        batches.append(batch)
        return batch

    trainer._generate_and_score_completions = recording
    before = {k: v.detach().clone() for k, v in trainer.model.named_parameters()}
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history) and trainer.state.global_step == 1
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.named_parameters())
    assert llm.generate_calls == 1 and len(batches) == 1
    (returned,) = llm.returned_completion_ids
    batch = batches[0]
    trained = [row[mask.bool()].tolist() for row, mask in zip(batch["completion_ids"], batch["completion_mask"])]
    assert trained == returned  # what TRL trains on is what the stand-in generated
    assert llm.model.received_names and set().union(*llm.model.received_names) <= set(trainer.model.state_dict())
    if "importance_sampling_ratio" in batch:  # TRL >= 0.23: the stand-in's logprobs feed the IS correction
        ratio = batch["importance_sampling_ratio"]  # per token, or per sequence (0.26+'s sequence modes)
        assert torch.isfinite(ratio).all() and ratio.shape[0] == len(trained)
