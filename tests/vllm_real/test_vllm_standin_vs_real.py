"""The vLLM stand-in (``tests/vllm_standin``) against the real engine, live, on the same inputs.

Runs where a real vLLM runs (the vllm-cpu-real cell; a GPU box). The stand-in is loaded from its
source directory under another package name (``_vllm_standin``), so both live in one process, and
each case is fed to both engines built from the same tiny Qwen2 checkpoint:

* ``load_weights``: which names each accepts (its return value) for a full state dict, a subset,
  names vLLM skips (``rotary_emb.inv_freq``), and the exception (type and message) for a PEFT
  name (``base_model...``; from vLLM 0.15 the message lists the parameters the model has) and for
  an unknown name inside a known module (from vLLM 0.13 Qwen2 skips it: no error, nothing accepted);
* the attributes TRL 1.x reaches: ``llm_engine.model_executor.driver_worker.model_runner.model``
  (whose ``load_weights`` it calls) and ``llm_engine.model_config.max_model_len``;
* ``collective_rpc("reload_weights")`` (TRL >= 0.26 after a level-2 sleep): the checkpoint back;
* greedy float32 generation after ``load_weights`` and a prefix-cache reset: the same token ids;
* the prefix cache: per ``generate()``, how many prompt tokens are served from it (real:
  ``real_vllm.PrefixCacheMeter``; stand-in: ``prefix_cache_log[-1]["hit_tokens"]``) through
  repeat, ``load_weights`` (kept: stale), ``reset_prefix_cache()`` (emptied).

* from vLLM 0.10 (``logprobs_mode``): the log-probs ``SamplingParams(logprobs=0)`` returns at
  temperature 0.7 from a model with peaked logits, raw and processed, each compared by value with
  the log-softmax of the Hugging Face model's logits at T=1 and at T=0.7 for the tokens that engine
  sampled (``raw_logprobs`` is T=1; 0.10.2's ``processed_logprobs`` is T).

The stand-in follows the version it is installed as; loaded from source here, it reads the real
engine's version (``vllm-cpu`` 0.8.5.post2 in ``vllm-cpu-real``, 0.10.2.post2 in
``vllm-cpu-real-0.10``, 0.17.1 in ``vllm-cpu-real-0.17``) and is compared as
``tests/vllm_standin/v<that release>``. A difference that is a known version difference is named in
the test. Known differences from the real 0.10.2 / 0.17.1 CPU engines, asserted here so that they are
seen: ``reset_prefix_cache()`` returns None on the real 0.10 V1 engine (True on the stand-in and on
0.17.1); see ``test_known_differences_at_0_10`` (sleep mode: refused on the real CPU engine).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import pathlib
import sys

import pytest
import torch
import vllm

import real_vllm  # conftest.py's skip rule holds here
import tiny

STANDIN_SOURCE = pathlib.Path(__file__).parent.parent / "vllm_standin" / "vllm"
PROMPT = " ".join(tiny.vocab_words()[:40])  # blocks of 16 end at 16 and 32, then the partial last one


def load_standin():
    name = "_vllm_standin"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, STANDIN_SOURCE / "__init__.py", submodule_search_locations=[str(STANDIN_SOURCE)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


standin = load_standin()
assert standin.__stand_in__ and not getattr(vllm, "__stand_in__", False)
from _vllm_standin.engine.arg_utils import installed_version

RELEASE = ".".join(map(str, real_vllm.VERSION))  # 0.10.2.post2 -> 0.10.2, 0.10.1.1.post2 -> 0.10.1.1
V1 = real_vllm.V1
ENGINE = dict(enable_prefix_caching=True, block_size=16)


def test_the_standin_is_compared_as_the_real_release():
    """Loaded from source, the stand-in reads the real engine's version: it behaves as the stand-in
    directory of that release does (``tests/vllm_standin/v0.10.2`` for vllm-cpu 0.10.2.post2)."""
    assert installed_version()[:3] == real_vllm.VERSION[:3]
    assert (STANDIN_SOURCE.parent / f"v{RELEASE}").is_dir(), f"no tests/vllm_standin/v{RELEASE} for the real vLLM {vllm.__version__}"


def build_standin(checkpoint, **kwargs):
    """``standin.LLM`` as in a fresh process, leaving ``os.environ`` as it was: each engine records its
    choice in ``VLLM_USE_V1`` as vLLM >= 0.8 does (the real 0.10 one "1", which would make the
    stand-in refuse float32; the stand-in "0"), which must not steer the engines built after it."""
    saved = {k: os.environ.get(k) for k in ("VLLM_USE_V1", "VLLM_ENABLE_V1_MULTIPROCESSING")}
    os.environ.pop("VLLM_USE_V1", None)
    try:
        return standin.LLM(model=checkpoint, **real_vllm.engine_kwargs(**kwargs))
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def reset(llm):
    """``reset_prefix_cache()``: True on V0 and the stand-in; None on the real 0.10 V1 engine (its
    ``LLMEngine.reset_prefix_cache`` returns nothing, the reset is only logged); True again on 0.17.1."""
    got = llm.reset_prefix_cache()
    if llm.__class__.__module__.startswith("_vllm_standin") or not V1 or real_vllm.VERSION[:2] >= (0, 17):
        assert got is True
    else:
        assert got is None


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.save_tiny(tmp_path_factory.mktemp("standin-vs-real") / "tiny", "qwen2")


@pytest.fixture(scope="module")
def engines(checkpoint):
    real = vllm.LLM(model=checkpoint, **real_vllm.engine_kwargs(**ENGINE))
    fake = build_standin(checkpoint, **ENGINE)
    return real, fake


def both_load(engines, weights):
    """``load_weights(weights)`` on both models: (returned names or the exception) for each."""
    results = []
    for llm in engines:
        try:
            results.append(set(real_vllm.model_of(llm).load_weights(list(weights))))
        except Exception as exc:  # noqa: BLE001  (the exception is what is compared)
            results.append(exc)
    return results


def new_weights(seed):
    return list(tiny.make_model("qwen2", seed=seed).state_dict().items())


def test_same_names_accepted_for_a_full_state_dict(engines):
    real, fake = both_load(engines, new_weights(1))
    assert isinstance(real, set) and real == fake, sorted(real ^ fake) if isinstance(fake, set) else fake
    assert "model.layers.0.self_attn.qkv_proj.weight" in real and "model.layers.0.mlp.gate_up_proj.weight" in real


def test_same_names_accepted_for_a_subset(engines):
    weights = [(n, t) for n, t in new_weights(2) if ".layers.1." in n or n == "lm_head.weight"]
    real, fake = both_load(engines, weights)
    assert real == fake


def test_rotary_inv_freq_is_skipped_by_both(engines):
    inv_freq = torch.ones(16)
    real, fake = both_load(engines, [("model.layers.0.self_attn.rotary_emb.inv_freq", inv_freq)])
    assert real == fake == set()


def test_same_error_for_peft_names(engines):
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny.make_model("qwen2"), LoraConfig(r=4, target_modules=["q_proj"]))
    real, fake = both_load(engines, list(peft_model.state_dict().items()))
    assert type(real) is type(fake) is ValueError
    message = "There is no module or parameter named 'base_model' in Qwen2ForCausalLM"
    if real_vllm.VERSION[:2] < (0, 15):
        assert str(real) == str(fake) == message
        return
    # vLLM 0.15+ appends the parameters the model has, a set printed in its own order
    listed = []
    for error in (real, fake):
        head, _, names = str(error).partition(". The available parameters belonging to  (Qwen2ForCausalLM) are: ")
        assert head == message, str(error)
        listed.append(ast.literal_eval(names))
    assert listed[0] == listed[1] and "model.layers.0.self_attn.qkv_proj.weight" in listed[0]


def test_same_error_for_an_unknown_name_inside_a_known_module(engines):
    real, fake = both_load(engines, [("model.layers.0.self_attn.nonexistent.weight", torch.zeros(4))])
    assert type(real) is type(fake), (repr(real), repr(fake))
    if real_vllm.VERSION[:2] >= (0, 13):  # Qwen2Model.load_weights skips a name it lacks
        assert real == fake == set()
    else:
        assert real.args == fake.args, (repr(real), repr(fake))


def test_the_attributes_trl_1x_reaches(engines):
    """TRL 1.x (vllm_generation.py) syncs through ``llm_engine.model_executor.driver_worker.model_runner.model``
    and reads ``llm_engine.model_config.max_model_len``: both engines have them."""
    for llm in engines:
        model = llm.llm_engine.model_executor.driver_worker.model_runner.model
        assert model is real_vllm.model_of(llm)
        assert callable(model.load_weights)
        assert llm.llm_engine.model_config.max_model_len == 128


@pytest.mark.skipif(not V1, reason="the V0 CPU worker of vLLM 0.8.5 has no reload_weights (NotImplementedError)")
def test_reload_weights_brings_the_checkpoint_back(engines):
    """``collective_rpc("reload_weights")`` (TRL after a level-2 sleep) reloads the checkpoint the engine
    was built from: greedy tokens after other weights, then a reload, are the first ones on both."""
    real, fake = engines
    params = dict(temperature=0.0, max_tokens=8)

    def greedy(llm, module):
        reset(llm)
        (out,) = llm.generate([PROMPT], module.SamplingParams(**params), use_tqdm=False)
        return list(out.outputs[0].token_ids)

    for llm in engines:  # the checkpoint, whatever the tests before loaded
        llm.collective_rpc("reload_weights")
    before = [greedy(real, vllm), greedy(fake, standin)]
    both_load(engines, new_weights(5))
    changed = [greedy(real, vllm), greedy(fake, standin)]
    for llm in engines:
        assert llm.collective_rpc("reload_weights") == [None]
    after = [greedy(real, vllm), greedy(fake, standin)]
    assert before[0] == before[1] == after[0] == after[1]
    assert changed[0] == changed[1] != before[0]


def test_same_greedy_tokens_after_load_weights(engines):
    weights = new_weights(3)
    both_load(engines, weights)
    real, fake = engines
    outputs = []
    for llm, module in ((real, vllm), (fake, standin)):
        reset(llm)
        (out,) = llm.generate([PROMPT], module.SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
        outputs.append(list(out.outputs[0].token_ids))
    assert outputs[0] == outputs[1]


def test_same_prefix_cache_hits_across_load_weights_and_reset(engines):
    real, fake = engines
    meter = real_vllm.PrefixCacheMeter(real)

    def cached():
        for llm, module in ((real, vllm), (fake, standin)):
            llm.generate([PROMPT], module.SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
        return meter.take(), fake.prefix_cache_log[-1]["hit_tokens"]

    for llm in engines:
        reset(llm)
    trace = [cached(), cached()]
    both_load(engines, new_weights(4))
    trace.append(cached())  # kept across load_weights: served although computed by the old weights
    for llm in engines:
        reset(llm)
    trace += [cached(), cached()]
    assert [r for r, _ in trace] == [f for _, f in trace], trace
    assert [r for r, _ in trace] == [0, 32, 32, 0, 32]
    assert meter.block_size == 16


# -- log-probs (vLLM >= 0.10: logprobs_mode) ----------------------------------------------------------

TEMPERATURE = 0.7
needs_logprobs_mode = pytest.mark.skipif(real_vllm.VERSION[:2] < (0, 10), reason="logprobs_mode is an engine field from vLLM 0.10")


@pytest.fixture(scope="module")
def peaked_checkpoint(tmp_path_factory):
    """A tiny Qwen2 whose logits are scaled up (as in tests/patches/test_vllm_is_raw_logprobs.py): a
    near-uniform random model's log-probs barely move with the temperature."""
    model = tiny.make_model("qwen2")
    with torch.no_grad():
        model.lm_head.weight.mul_(10.0)
    path = tiny.save_tiny(tmp_path_factory.mktemp("standin-vs-real-logprobs") / "peaked", model=model)
    return path, model


def hf_logprobs(model, prompt_ids, completion_ids, temperature):
    """log_softmax(logits / temperature) of the Hugging Face model at each completion token."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(completion_ids)[:, None])[:, 0]


def sampled_logprobs(llm, module):
    """8 sampled completions (T=0.7, logprobs=0): [(prompt ids, completion ids, log-probs)]."""
    prompts = [" ".join(tiny.vocab_words()[i * 7 : i * 7 + 6]) for i in range(4)]
    params = module.SamplingParams(temperature=TEMPERATURE, max_tokens=8, logprobs=0, n=2, seed=1)
    out = []
    for request in llm.generate(prompts, params, use_tqdm=False):
        for completion in request.outputs:
            assert [list(lp) for lp in completion.logprobs] == [[t] for t in completion.token_ids]  # the sampled token only
            values = torch.tensor([next(iter(lp.values())).logprob for lp in completion.logprobs])
            out.append((request.prompt_token_ids, list(completion.token_ids), values))
    return out


@needs_logprobs_mode
@pytest.mark.parametrize("mode", ["raw_logprobs", "processed_logprobs"])
def test_logprobs_mode_values_match_on_both(peaked_checkpoint, mode):
    path, model = peaked_checkpoint
    # vLLM 0.10.0 / 0.10.1 took the "processed" values before the temperature, 0.10.2 after it
    tempered = mode == "processed_logprobs" and real_vllm.VERSION[:3] >= (0, 10, 2)
    expected_t, other_t = (TEMPERATURE, 1.0) if tempered else (1.0, TEMPERATURE)
    real = vllm.LLM(model=path, **real_vllm.engine_kwargs(logprobs_mode=mode))
    fake = build_standin(path, logprobs_mode=mode)
    for llm, module in ((real, vllm), (fake, standin)):
        samples = sampled_logprobs(llm, module)
        assert sum(len(c) for _, c, _ in samples) >= 16
        got = torch.cat([v for _, _, v in samples])
        want = torch.cat([hf_logprobs(model, p, c, expected_t) for p, c, _ in samples])
        other = torch.cat([hf_logprobs(model, p, c, other_t) for p, c, _ in samples])
        torch.testing.assert_close(got, want, atol=2e-3, rtol=1e-3, msg=lambda m, llm=llm: f"{type(llm).__module__}: {m}")
        assert (got - other).abs().mean().item() > 0.05, (type(llm).__module__, got, other)  # the temperature matters here
    del real


@pytest.mark.skipif(not V1, reason="differences of the real V1 engine on the CPU (vLLM >= 0.10)")
def test_known_differences_at_0_10(checkpoint):
    """What the real vLLM 0.10 CPU engine does and the stand-in does not, asserted on both so that a
    change on either side is seen. Not imitated, because the stand-in cells rely on the other side:
    * ``dtype="float32"`` with ``VLLM_USE_V1`` unset: real V1 (vLLM 0.9.2 dropped V1's float16 /
      bfloat16-only rule); the stand-in falls back to V0 (vLLM 0.8 / 0.9.1's rule), whose
      ``model_executor`` its cells' tests read without ``external_launcher``;
    * ``dtype="auto"`` on a float32 checkpoint: real bfloat16 (0.9.1's ``_resolve_auto_dtype``: the
      platform's first dtype, bfloat16 on x86 CPUs and Ampere+ GPUs); the stand-in float16 (vLLM
      0.8's rule), whose noise its cells' tolerances are set for;
    * ``reset_prefix_cache()``: None on the real 0.10 V1 engine, True on the stand-in (``reset``);
    * ``enable_sleep_mode=True``: the real vLLM 0.17.1 CPU engine refuses it (a ``ValueError``, pydantic's
      ``ValidationError`` of ``ModelConfig``: "Sleep mode is not supported on current platform.": sleep
      mode is CUDA / ROCm only); the stand-in accepts it, as
      vLLM does on a GPU, where TRL's sleep-mode runs (``vllm-sleep-mode-weights``) are at home.
    Both reject ``device=`` (``EngineArgs.device`` is gone from 0.10.0)."""
    from vllm.v1.engine.llm_engine import LLMEngine as RealV1

    real = vllm.LLM(model=checkpoint, **real_vllm.engine_kwargs(max_model_len=64))
    assert type(real.llm_engine) is RealV1
    assert real_vllm.model_of(real).model.embed_tokens.weight.dtype == torch.float32
    auto = dict(real_vllm.engine_kwargs(max_model_len=64), dtype="auto")
    real_auto = vllm.LLM(model=checkpoint, **auto)
    assert real_vllm.model_of(real_auto).model.embed_tokens.weight.dtype == torch.bfloat16
    fake = build_standin(checkpoint, max_model_len=64)
    assert "v1" not in type(fake.llm_engine).__module__.split(".")
    fake_auto = build_standin(checkpoint, max_model_len=64, dtype="auto")
    assert fake_auto.dtype == torch.float16
    for module in (vllm, standin):
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'device'"):
            module.LLM(model=checkpoint, device="cpu", **real_vllm.engine_kwargs(max_model_len=64))
    if real_vllm.VERSION[:2] >= (0, 17):
        # pydantic's ValidationError of ModelConfig, a ValueError
        with pytest.raises(ValueError, match=r"Value error, Sleep mode is not supported on current platform\."):
            vllm.LLM(model=checkpoint, enable_sleep_mode=True, **real_vllm.engine_kwargs(max_model_len=64))
        sleepy = build_standin(checkpoint, max_model_len=64, enable_sleep_mode=True)
        sleepy.sleep(level=1)
        assert sleepy.sleeping_tags == {"weights", "kv_cache"}
