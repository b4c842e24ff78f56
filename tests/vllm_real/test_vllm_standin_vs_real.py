"""The vLLM stand-in (``tests/vllm_standin``) against the real engine, live, on the same inputs.

Runs where a real vLLM runs (the vllm-cpu-real cell; a GPU box). The stand-in is loaded from its
source directory under another package name (``_vllm_standin``), so both live in one process, and
each case is fed to both engines built from the same tiny Qwen2 checkpoint:

* ``load_weights``: which names each accepts (its return value) for a full state dict, a subset,
  names vLLM skips (``rotary_emb.inv_freq``), and the exception (type and message) for a PEFT
  name (``base_model...``) and for an unknown name inside a known module;
* greedy float32 generation after ``load_weights`` and a prefix-cache reset: the same token ids;
* the prefix cache: per ``generate()``, how many prompt tokens are served from it (real:
  ``real_vllm.PrefixCacheMeter``; stand-in: ``prefix_cache_log[-1]["hit_tokens"]``) through
  repeat, ``load_weights`` (kept: stale), ``reset_prefix_cache()`` (emptied).

The stand-in imitates vLLM 0.7.2 (what TRL 0.14/0.15 pinned); the real engine here may be newer
(vllm-cpu 0.8.5.post2). A difference that is a known version difference is named in the test.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")
vllm = pytest.importorskip("vllm")
import real_vllm

if real_vllm.skip_reason():
    pytest.skip(real_vllm.skip_reason(), allow_module_level=True)

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

ENGINE = dict(enable_prefix_caching=True, block_size=16)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return tiny.save_tiny(tmp_path_factory.mktemp("standin-vs-real") / "tiny", "qwen2")


@pytest.fixture(scope="module")
def engines(checkpoint):
    real = vllm.LLM(model=checkpoint, **real_vllm.engine_kwargs(**ENGINE))
    fake = standin.LLM(model=checkpoint, **real_vllm.engine_kwargs(**ENGINE))
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
    assert str(real) == str(fake) == "There is no module or parameter named 'base_model' in Qwen2ForCausalLM"


def test_same_error_for_an_unknown_name_inside_a_known_module(engines):
    real, fake = both_load(engines, [("model.layers.0.self_attn.nonexistent.weight", torch.zeros(4))])
    assert type(real) is type(fake), (repr(real), repr(fake))
    assert real.args == fake.args, (repr(real), repr(fake))


def test_same_greedy_tokens_after_load_weights(engines):
    weights = new_weights(3)
    both_load(engines, weights)
    real, fake = engines
    outputs = []
    for llm, module in ((real, vllm), (fake, standin)):
        assert llm.reset_prefix_cache()
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
        assert llm.reset_prefix_cache()
    trace = [cached(), cached()]
    both_load(engines, new_weights(4))
    trace.append(cached())  # kept across load_weights: served although computed by the old weights
    for llm in engines:
        assert llm.reset_prefix_cache()
    trace += [cached(), cached()]
    assert [r for r, _ in trace] == [f for _, f in trace], trace
    assert [r for r, _ in trace] == [0, 32, 32, 0, 32]
    assert meter.block_size == 16
