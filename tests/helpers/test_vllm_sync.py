"""vllm-lora-names (TRL 0.14.0) and vllm-merged-weights (TRL 0.15.0), and the one sync path
they share, ``trl_compat._helpers.vllm_sync``.

* Unit tests of ``iter_vllm_weights`` on plain PEFT / transformers models (every cell with
  torch + transformers; PEFT cases need peft): names and values against PEFT's own
  ``merge_and_unload()`` (bit for bit) and against ``W + scaling * B @ A`` in float64; the
  training model bit-identical afterwards; at most one yielded tensor alive at a time.
* The same through the vLLM stand-in's real ``load_weights`` rules (cells where the stand-in
  is installed).
* Real GRPO runs with LoRA + ``use_vllm`` on the stand-in (TRL 0.14.0 / 0.15.0 cells): the bug
  without the patch, merged weights after every sync and untouched training weights with it.
* Patch status per cell (later cells: "not needed").
"""

from __future__ import annotations

import copy
import importlib.metadata
import os
import sys
import types
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat
from trl_compat._helpers import vllm_sync
from trl_compat._helpers.models import peel

import tiny
from cells import only_in_cells
from workers import child_env

LORA_ID, MERGED_ID = "vllm-lora-names", "vllm-merged-weights"
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _have(module):
    try:
        __import__(module)
        return True
    except Exception:  # noqa: BLE001
        return False


HAVE_PEFT = _have("peft")
needs_peft = pytest.mark.skipif(not HAVE_PEFT, reason="peft is not installed")


def _trl_version():
    try:
        from packaging.version import Version

        return Version(importlib.metadata.version("trl"))
    except importlib.metadata.PackageNotFoundError:
        return None


def _standin_installed():
    try:
        import vllm
    except Exception:  # noqa: BLE001
        return False
    return bool(getattr(vllm, "__stand_in__", False))


# -- helpers ------------------------------------------------------------------------------------


def lora(model=None, dtype=torch.float32, seed=0, **kwargs):
    """A PeftModel with non-zero B (``init_lora_weights=False``), so merged != base."""
    from peft import LoraConfig, get_peft_model

    model = model if model is not None else tiny.make_model("qwen2")
    kwargs.setdefault("target_modules", TARGETS)
    kwargs.setdefault("r", 8)
    kwargs.setdefault("lora_alpha", 16)
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(seed)
        return get_peft_model(model.to(dtype), LoraConfig(init_lora_weights=False, **kwargs))


def reference_state(model):
    """What a plain model of the base architecture holds: PEFT's own merge on a deep copy."""
    model = peel(model, peft=False, fsdp=False)
    model = copy.deepcopy(model)
    if hasattr(model, "merge_and_unload"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = model.merge_and_unload()
    return model.state_dict()


def snapshot(model):
    return {n: (p, p.detach().clone(), p.data_ptr()) for n, p in model.named_parameters()}


def assert_untouched(model, snap):
    """Same Parameter objects, same storage, same bits."""
    now = dict(model.named_parameters())
    assert list(now) == list(snap)
    for name, (param, values, ptr) in snap.items():
        assert now[name] is param, name
        assert param.data_ptr() == ptr, name
        assert torch.equal(param.detach(), values), f"{name} changed by the sync"


def formula_check(peft_model, got):
    """Every LoRA layer's sent weight against ``W + sum_a scaling_a * B_a @ A_a`` in float64,
    from the raw parameters (independent of PEFT's merge code)."""
    from peft.tuners.lora import LoraLayer

    base = peft_model.get_base_model()
    checked = 0
    for name, layer in base.named_modules():
        if not isinstance(layer, LoraLayer) or layer.merged:
            continue
        active = layer.active_adapters
        weight = layer.get_base_layer().weight.detach().double()
        expected = weight.clone()
        for a in active:
            if a in layer.lora_A:
                delta = layer.lora_B[a].weight.double() @ layer.lora_A[a].weight.double()
                expected += layer.scaling[a] * (delta.T if layer.fan_in_fan_out else delta)
            elif a in getattr(layer, "lora_embedding_A", {}):
                delta = layer.lora_embedding_B[a].double() @ layer.lora_embedding_A[a].double()
                expected += layer.scaling[a] * delta.T
        sent = got[name + ".weight"].double()
        tol = 1e-5 if weight.dtype == torch.float32 else 2e-2
        assert torch.allclose(sent, expected, atol=tol, rtol=tol), name
        checked += 1
    return checked


def check_stream(model, *, formula=True):
    """Stream ``model``; compare with the reference; the model must be untouched."""
    ref = reference_state(model)
    snap = snapshot(model)
    got = list(vllm_sync.iter_vllm_weights(model))
    names = [n for n, _ in got]
    assert names == list(ref)  # base names, state_dict order, nothing extra, nothing missing
    assert not [
        n
        for n in names
        if "lora_" in n
        or "base_layer" in n
        or "base_model" in n
        or "modules_to_save" in n
        or "original_module" in n
        or "_orig_mod" in n
    ]
    for name, tensor in got:
        assert tensor.dtype == ref[name].dtype and torch.equal(tensor, ref[name]), name
    assert_untouched(model, snap)
    peft_model = peel(model, peft=False, fsdp=False)
    if formula and hasattr(peft_model, "get_base_model"):
        assert formula_check(peft_model, dict(got)) > 0
    return dict(got)


# -- the sync itself, on plain models -------------------------------------------------------------


def test_plain_model_sends_exactly_its_state_dict():
    model = tiny.make_model("qwen2", tie_word_embeddings=True)
    sd = model.state_dict()
    got = list(vllm_sync.iter_vllm_weights(model))
    assert [n for n, _ in got] == list(sd)
    # full fine-tuning: nothing is computed or copied, the tensors are the parameters
    assert all(t.data_ptr() == sd[n].data_ptr() and torch.equal(t, sd[n]) for n, t in got)


def test_compiled_model_sends_base_names():
    model = tiny.make_model("llama")
    compiled = torch.compile(model)
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")  # what TRL would have sent
    assert [n for n, _ in vllm_sync.iter_vllm_weights(compiled)] == list(model.state_dict())


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return GPT2LMHeadModel(GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=64))


def _two_adapters(active):
    from peft import LoraConfig

    model = lora()
    with warnings.catch_warnings(), torch.random.fork_rng(devices=[]):
        warnings.simplefilter("ignore")
        torch.manual_seed(1)
        model.add_adapter(
            "b", LoraConfig(r=4, lora_alpha=32, target_modules=["q_proj", "v_proj"], use_rslora=True, init_lora_weights=False)
        )
    if active == "both":
        model.base_model.set_adapter(["default", "b"])
    else:
        model.set_adapter(active)
    return model


def _modules_to_save():
    model = lora(target_modules=TARGETS + ["embed_tokens"], modules_to_save=["lm_head"])
    with torch.no_grad():  # the trained copy differs from the original
        for p in model.base_model.model.lm_head.modules_to_save["default"].parameters():
            p.add_(1.0)
    return model


def _bf16_base_fp32_adapters(**kwargs):
    return _adapters_to(lora(dtype=torch.bfloat16, **kwargs), torch.float32)


def _adapters_to(model, dtype):
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.to(dtype)
    return model


def _already_merged():
    model = lora()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.merge_adapter()
    return model


def _lora_bias():
    model = lora(target_modules=["q_proj", "k_proj", "v_proj"], lora_bias=True)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name and name.endswith("bias"):
                p.add_(0.5)
    return model


def _scaled(alpha, base=torch.float32, adapters=None):
    """r=8: scaling alpha / 8 (2.0 is folded into B, 1.5 and 0.5 are not)."""
    model = lora(dtype=base, lora_alpha=alpha)
    return _adapters_to(model, adapters) if adapters is not None else model


LORA_CASES = {
    "fp32": lambda: lora(),  # r=8, alpha=16: scaling 2, folded into B
    # PEFT keeps half-precision adapters in float32 by default (autocast_adapter_dtype):
    "bf16-base-bf16-adapters": lambda: _adapters_to(lora(dtype=torch.bfloat16), torch.bfloat16),
    "fp16-base-fp16-adapters": lambda: _adapters_to(lora(dtype=torch.float16), torch.float16),
    "bf16-base-fp32-adapters": _bf16_base_fp32_adapters,
    "bf16-base-fp32-adapters-embedding": lambda: _bf16_base_fp32_adapters(target_modules=["embed_tokens", "q_proj"]),
    "fp32-base-bf16-adapters": lambda: _adapters_to(lora(), torch.bfloat16),
    "llama": lambda: lora(tiny.make_model("llama")),
    "scaling-one": lambda: lora(lora_alpha=8),  # r=8: scaling 1.0, the multiply is skipped
    **{
        f"scaling-{alpha / 8}-{name}": (lambda alpha=alpha, dtypes=dtypes: _scaled(alpha, *dtypes))
        for alpha in (32, 12, 4)  # 4.0 (folded), 1.5 and 0.5 (not)
        for name, dtypes in (("fp32", ()), ("bf16-base-fp32-adapters", (torch.bfloat16,)), ("bf16", (torch.bfloat16, torch.bfloat16)))
    },
    "second-adapter-active-rslora": lambda: _two_adapters("b"),
    "two-adapters-active": lambda: _two_adapters("both"),
    "already-merged": _already_merged,
    "modules-to-save-and-embedding-lora": _modules_to_save,
    "tied-embeddings-lora-on-embedding": lambda: lora(
        tiny.make_model("qwen2", tie_word_embeddings=True), target_modules=["embed_tokens", "q_proj"]
    ),
    "gpt2-fan-in-fan-out": lambda: lora(_gpt2(), target_modules=["c_attn", "c_proj", "c_fc"], fan_in_fan_out=True),
    "gpt2-fan-in-fan-out-bf16": lambda: lora(_gpt2(), dtype=torch.bfloat16, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True),
    # merged by PEFT's own merge() on a private copy of the layer:
    "dora": lambda: lora(use_dora=True),
    "lora-bias": _lora_bias,
}


@needs_peft
@pytest.mark.parametrize("case", list(LORA_CASES))
def test_lora_merged_bit_exact_and_model_untouched(case):
    model = LORA_CASES[case]()
    got = check_stream(model, formula=case not in ("dora", "already-merged"))
    if case == "already-merged":  # not merged twice: the live (merged) weight is sent as it is
        layer = model.base_model.model.model.layers[0].self_attn.q_proj
        assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], layer.base_layer.weight)
    if case == "modules-to-save-and-embedding-lora":
        wrapper = model.base_model.model.lm_head
        assert torch.equal(got["lm_head.weight"], wrapper.modules_to_save["default"].weight)
        assert not torch.equal(got["lm_head.weight"], wrapper.original_module.weight)


@needs_peft
def test_lora_merged_is_not_base():
    """Guard for the tests above: with these adapters merged and base weights really differ."""
    model = lora()
    got = dict(vllm_sync.iter_vllm_weights(model))
    base = model.base_model.model.model.layers[1].mlp.down_proj.base_layer.weight
    assert (got["model.layers.1.mlp.down_proj.weight"] - base).abs().max() > 1e-2


DTYPES = {"fp32": (), "bf16-base-fp32-adapters": (torch.bfloat16, torch.float32), "bf16": (torch.bfloat16, torch.bfloat16)}


@needs_peft
@pytest.mark.parametrize("dtypes", list(DTYPES))
@pytest.mark.parametrize("alpha, folded", [(16, True), (32, True), (8, False), (12, False), (4, False)])
def test_scaling_folded_into_b_only_when_a_power_of_two_above_one(alpha, folded, dtypes, monkeypatch):
    """r=8: scaling 2 and 4 are applied to B (out x r) instead of the weight-sized ``B @ A``;
    1, 1.5 and 0.5 are not. Either way vLLM gets PEFT's bits."""
    from trl_compat._helpers.vllm_sync import merge

    answers = []
    real = merge.fold_is_exact
    monkeypatch.setattr(merge, "fold_is_exact", lambda *args: answers.append(real(*args)) or answers[-1])
    model = _scaled(alpha, *DTYPES[dtypes])
    check_stream(model)
    lora_layers = [m for m in model.modules() if hasattr(m, "lora_A") and m.lora_A]
    assert len(answers) == len(lora_layers) > 0  # asked once per LoRA weight
    assert set(answers) == {folded}


# Adapters for which ``(B * scaling) @ A`` is NOT PEFT's ``(B @ A) * scaling``: (scaling, A's and
# B's value, or None for PEFT's random init, adapter dtypes where the fold would change the bits;
# with bfloat16 adapters a float32 ulp apart rarely survives the rounding to bfloat16).
FOLD_TRAPS = {
    "scaling-1.5": (1.5, None, None, ("fp32",)),  # B * 1.5 rounds
    "scaling-rslora-16/sqrt(8)": (16 / 8**0.5, None, None, ("fp32",)),
    "scaling-0.5-B-goes-subnormal": (0.5, 1.0, (1 + 2**-23) * 2**-126, ("fp32",)),
    "scaling-2-products-subnormal": (2.0, 2**-74, 1.375 * 2**-75, ("fp32",)),
    "scaling-2-B-times-scaling-overflows": (2.0, 2**-10, 1.5 * 2**127, ("fp32", "bf16")),
}


@needs_peft
@pytest.mark.parametrize("trap, adapters", [(t, d) for t, v in FOLD_TRAPS.items() for d in v[3]])
def test_scaling_not_folded_where_that_changes_bits(trap, adapters):
    from trl_compat._helpers.vllm_sync import fold, merge

    scaling, a_value, b_value, _ = FOLD_TRAPS[trap]
    model = _adapters_to(lora(), torch.float32 if adapters == "fp32" else torch.bfloat16)
    layer = model.base_model.model.model.layers[0].self_attn.q_proj
    layer.scaling["default"] = scaling
    with torch.no_grad():
        layer.base_layer.weight.zero_()  # the merged weight is the delta: no bit of it hidden by W
        if a_value is not None:
            layer.lora_A["default"].weight.fill_(a_value)
            layer.lora_B["default"].weight.fill_(b_value)
    weight_a, weight_b = (
        layer.lora_A["default"].weight.detach().float(),
        layer.lora_B["default"].weight.detach().float(),
    )  # PEFT's CPU math
    peft_delta = copy.deepcopy(layer).get_delta_weight("default")
    assert not torch.equal(((weight_b * scaling) @ weight_a).to(peft_delta.dtype), peft_delta)  # a real trap
    assert not fold.fold_is_exact(weight_a, weight_b, scaling)
    for workspace in (None, merge.Workspace()):
        assert torch.equal(merge._lora_delta(layer, "default", False, workspace), peft_delta)
    got = check_stream(model, formula=False)  # vLLM gets PEFT's merged bits, the model untouched
    assert torch.equal(got["model.layers.0.self_attn.q_proj.weight"], peft_delta)


@needs_peft
@pytest.mark.parametrize("case", ["fp32", "gpt2-fan-in-fan-out", "dora"])
def test_one_yielded_tensor_alive_at_a_time(case):
    """Streaming: once the receiver drops an item, nothing of ours keeps it alive, so the sync
    never holds more than the tensor being sent (no second copy of the model)."""
    model = LORA_CASES[case]()
    alive = []
    peak = 0
    for _name, tensor in vllm_sync.iter_vllm_weights(model):
        alive = [r for r in alive if r() is not None]
        peak = max(peak, len(alive))
        alive.append(weakref.ref(tensor))
        del tensor
    assert peak == 0


@needs_peft
@pytest.mark.parametrize("question_adds_a_user", [True, False])
@pytest.mark.parametrize("case", ["fp32", "bf16-base-fp32-adapters", "gpt2-fan-in-fan-out"])
def test_merged_buffers_reused_only_when_nobody_holds_them(case, question_adds_a_user, monkeypatch):
    """A receiver that copies each item and drops it lets the stream reuse two buffers for all
    merged weights; one that keeps each item, or only a view of it, still gets every value intact.
    Whether asking for a storage's use count counts the storage object the question creates
    differs between torch releases (vLLM's torch 2.6 vs 2.13 here): both are taken."""
    from trl_compat._helpers.vllm_sync import merge

    if not question_adds_a_user:
        real = merge._storage_users()
        monkeypatch.setattr(merge, "_storage_users", lambda: lambda cdata: real(cdata) - 1)
    model = LORA_CASES[case]()
    ref = reference_state(model)
    lora_names = {
        n + ".weight"
        for n, m in peel(model, peft=False, fsdp=False).get_base_model().named_modules()
        if hasattr(m, "lora_A") and m.lora_A
    }
    addresses = set()
    for name, tensor in vllm_sync.iter_vllm_weights(model):
        assert torch.equal(tensor, ref[name]), name
        if name in lora_names:
            addresses.add(tensor.untyped_storage().data_ptr())
        del tensor
    assert len(lora_names) > 2 and len(addresses) <= 2
    kept = [(name, tensor[:]) for name, tensor in vllm_sync.iter_vllm_weights(model)]  # a view each
    for name, view in kept:
        assert torch.equal(view, ref[name]), name
    for name, tensor in list(vllm_sync.iter_vllm_weights(model)):  # what a spy of load_weights does
        assert torch.equal(tensor, ref[name]), name


def test_unknown_structure_is_refused_before_anything_is_sent():
    class FullyShardedDataParallel(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self._fsdp_wrapped_module = inner

    model = tiny.make_model("qwen2")
    model.model.layers[0] = FullyShardedDataParallel(model.model.layers[0])
    with pytest.raises(vllm_sync.UnsupportedModel, match="FSDP"):
        vllm_sync.iter_vllm_weights(model)
    trainer = types.SimpleNamespace(model=model, accelerator=types.SimpleNamespace(is_main_process=True), llm=None)
    assert vllm_sync.sync_trainer(trainer) is False  # -> TRL's own code runs instead


# -- through the vLLM stand-in's load_weights ------------------------------------------------------


needs_standin = pytest.mark.skipif(not _standin_installed(), reason="the vLLM stand-in is not installed")


def _standin(tmp_path, base_model):
    import vllm

    path = tiny.save_tiny(tmp_path / "ckpt", model=base_model)
    return vllm.LLM(model=path, dtype="float32")


def _fake_trainer(model, llm):
    return types.SimpleNamespace(model=model, llm=llm, accelerator=types.SimpleNamespace(is_main_process=True))


@needs_standin
@pytest.mark.parametrize(
    "case",
    [
        "full-ft",
        "compiled-full-ft",
        "lora",
        "compiled-lora",
        "bf16-lora",
        "modules-to-save-and-embedding-lora",
        "two-adapters-active",
        "dora",
    ],
)
def test_standin_holds_exactly_the_merged_weights(tmp_path, case):
    if case not in ("full-ft", "compiled-full-ft") and not HAVE_PEFT:
        pytest.skip("peft is not installed")
    base = tiny.make_model("qwen2")
    llm = _standin(tmp_path, base)
    model = {
        "full-ft": lambda: tiny.make_model("qwen2", seed=1),
        "compiled-full-ft": lambda: torch.compile(tiny.make_model("qwen2", seed=1)),
        "lora": lambda: lora(base),
        "compiled-lora": lambda: torch.compile(lora(base)),
        "bf16-lora": lambda: lora(base, dtype=torch.bfloat16),
        "modules-to-save-and-embedding-lora": _modules_to_save,
        "two-adapters-active": lambda: _two_adapters("both"),
        "dora": lambda: lora(base, use_dora=True),
    }[case]()
    ref = reference_state(model)
    snap = snapshot(model)
    assert vllm_sync.sync_trainer(_fake_trainer(model, llm)) is True
    assert_untouched(model, snap)
    held = llm.model.hf_state_dict()
    assert llm.model.received_names[-1] == list(ref)
    for name, tensor in held.items():
        assert torch.equal(tensor, ref[name].to(tensor.dtype)), name


@needs_standin
@needs_peft
def test_standin_rejects_what_trl_0_14_sends(tmp_path):
    """The stand-in's rule that TRL 0.14.0 trips over, shown without TRL."""
    model = lora(tiny.make_model("qwen2"))
    llm = _standin(tmp_path, tiny.make_model("qwen2"))
    # from vLLM 0.15 the message goes on with the parameters the model has (tests/test_fixtures.py)
    with pytest.raises(
        ValueError, match=r"^There is no module or parameter named 'base_model' in Qwen2ForCausalLM($|\. The available)"
    ):
        llm.model.load_weights(model.state_dict().items())


@needs_peft
def test_inplace_fallback_for_structures_the_stream_does_not_know(monkeypatch, caplog):
    """The last-resort path (upstream 0.15.1's merge/load/unmerge): merged values reach vLLM."""
    model = lora()
    ref = reference_state(model)

    def refuse(root, peft):
        raise vllm_sync.UnsupportedModel("a structure for this test")

    class Receiver:
        def load_weights(self, weights):
            self.got = {n: t.detach().clone() for n, t in weights}

    receiver = Receiver()
    monkeypatch.setattr(vllm_sync.stream, "plan_steps", refuse)
    monkeypatch.setattr(vllm_sync.trainer, "vllm_model_of", lambda trainer: receiver)
    with caplog.at_level("WARNING", logger="trl_compat"):
        assert vllm_sync.sync_trainer(_fake_trainer(model, None)) is True
    assert "in-place merge_adapter()" in caplog.text
    assert list(receiver.got) == list(ref)
    assert all(torch.equal(receiver.got[n], ref[n]) for n in ref)
    assert not any(layer.merged for layer in model.modules() if hasattr(layer, "merged_adapters"))


# 0.15.0.dev0 main-branch variants of the bug (the wheels only have 0.14.0's inline one):
# PR #2762 (1f344c937) moved the inline sync into _prepare_inputs; PR #2817 (b9df81045) made it
# a _move_model_to_vllm method, still without name stripping.
DEV_SOURCES = {
    "inline-_prepare_inputs@1f344c937": """
class GRPOTrainer:
    def _prepare_inputs(self, inputs):
        if self.args.use_vllm:
            if self.state.global_step != self._last_loaded_step:
                with unwrap_model_for_generation(self.model, self.accelerator) as unwrapped_model:
                    state_dict = unwrapped_model.state_dict()
                if self.accelerator.is_main_process:
                    llm_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
                    llm_model.load_weights(state_dict.items())
                self._last_loaded_step = self.state.global_step
        return inputs
""",
    "method-_move_model_to_vllm@b9df81045": """
class GRPOTrainer:
    def _move_model_to_vllm(self):
        with unwrap_model_for_generation(self.model, self.accelerator) as unwrapped_model:
            if is_compiled_module(unwrapped_model):
                state_dict = unwrapped_model._orig_mod.state_dict()
            else:
                state_dict = unwrapped_model.state_dict()
        if self.accelerator.is_main_process:
            llm_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
            llm_model.load_weights(state_dict.items())

    def _prepare_inputs(self, inputs):
        if self.args.use_vllm:
            if self.state.global_step != self._last_loaded_step:
                self._move_model_to_vllm()
                self._last_loaded_step = self.state.global_step
        return inputs
""",
}


@needs_peft
@pytest.mark.parametrize("variant", list(DEV_SOURCES))
def test_dev_build_variants(tmp_path, variant):
    if not _standin_installed():
        pytest.skip("the vLLM stand-in is not installed")
    import importlib.util

    from trl_compat._engine import Patcher
    from trl_compat.patches import vllm_lora_names, vllm_merged_weights

    path = tmp_path / "grpo_dev.py"
    path.write_text(
        "import contextlib\n\n"
        "@contextlib.contextmanager\ndef unwrap_model_for_generation(model, accelerator):\n"
        "    yield model\n\ndef is_compiled_module(model):\n    return False\n" + DEV_SOURCES[variant]
    )
    spec = importlib.util.spec_from_file_location(f"grpo_dev_{abs(hash(variant))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert vllm_lora_names.probe(module).needed is True
    assert vllm_merged_weights.probe(module).needed is not True

    def trainer(model):
        t = module.GRPOTrainer()
        t.model, t.llm = model, _standin(tmp_path / str(id(t)), tiny.make_model("qwen2"))
        t.args, t.state = types.SimpleNamespace(use_vllm=True), types.SimpleNamespace(global_step=1)
        t.accelerator, t._last_loaded_step = types.SimpleNamespace(is_main_process=True), 0
        return t

    model = lora(tiny.make_model("qwen2"))
    with pytest.raises(ValueError, match="There is no module or parameter named 'base_model'"):
        trainer(model)._prepare_inputs([])
    patcher = Patcher("vllm-lora-names")
    vllm_lora_names.apply(module, patcher)
    try:
        t = trainer(model)
        t._prepare_inputs([])
        assert t._last_loaded_step == 1
        ref = reference_state(model)
        held = t.llm.model.hf_state_dict()
        assert t.llm.model.received_names == [list(ref)]  # one load, plain names
        assert all(torch.equal(held[n], ref[n]) for n in held)
    finally:
        patcher.undo()


# -- patch status per cell ------------------------------------------------------------------------


def _expected_status():
    from packaging.version import Version

    version = _trl_version()
    if version is None:
        return {LORA_ID: trl_compat.NOT_NEEDED, MERGED_ID: trl_compat.NOT_NEEDED}
    return {
        LORA_ID: trl_compat.APPLIED if Version("0.14.0") <= version < Version("0.15.0") else trl_compat.NOT_NEEDED,
        MERGED_ID: trl_compat.APPLIED if Version("0.15.0") <= version < Version("0.15.1") else trl_compat.NOT_NEEDED,
    }


def _import_grpo():
    if _trl_version() is None:
        return None
    return pytest.importorskip("trl.trainer.grpo_trainer")


def test_probes_read_the_real_code():
    """The probes on TRL's unpatched source: the bug where it is, not where it was fixed."""
    grpo = _import_grpo()
    version = _trl_version()
    if grpo is None or version.is_devrelease:
        pytest.skip("needs a released trl")
    from trl_compat.patches import vllm_lora_names, vllm_merged_weights

    from unpatched import without_patch

    def verdict(patch, pid):
        if trl_compat.status(pid) != trl_compat.APPLIED:
            return patch.probe(grpo)
        with without_patch(pid):
            return patch.probe(grpo)

    release = version.release[:3]
    lora_verdict, merged_verdict = verdict(vllm_lora_names, LORA_ID), verdict(vllm_merged_weights, MERGED_ID)
    if release[:2] == (0, 14):
        assert lora_verdict.needed is True and "compute_loss" in lora_verdict.reason
        assert merged_verdict.needed is False  # 0.14.0 has no _move_model_to_vllm
    elif release == (0, 15, 0):
        assert merged_verdict.needed is True and lora_verdict.needed is False
    elif release in ((0, 15, 1), (0, 15, 2)):  # inside vllm-merged-weights' window: the probe says no
        assert merged_verdict.needed is False and "after load_weights" in merged_verdict.reason
        assert lora_verdict.needed is False
    else:
        pytest.skip(f"trl {version}: outside both windows; the gate decides")


# -- real GRPO runs on the stand-in (TRL 0.14.0 / 0.15.0) -----------------------------------------


def _grpo_or_skip():
    grpo_run = pytest.importorskip("grpo_run")
    if not HAVE_PEFT:
        pytest.skip("peft is not installed")
    reason = grpo_run.vllm_unsupported_reason() if _trl_version() is not None else "trl is not installed"
    if reason is not None:
        pytest.skip(reason)
    return grpo_run


class SyncSpy:
    """Watches each call of the trainer method that contains TRL's vLLM sync (0.14:
    ``compute_loss``; 0.15: ``_prepare_inputs``). When the stand-in's weights changed during
    the call, records what it holds, the merged/base weights expected from the parameters as
    they were when the call began, and whether the parameters are unchanged after it."""

    def __init__(self, trainer):
        from packaging.version import Version

        self.trainer = trainer
        self.llm_model = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model
        self.records = []
        name = "compute_loss" if _trl_version() < Version("0.15.0") else "_prepare_inputs"
        original = getattr(trainer, name)

        def spy(*args, **kwargs):
            model = trainer.model
            version = self.llm_model.weights_version
            merged, base, snap = reference_state(model), _base_state(model), snapshot(model)
            try:
                return original(*args, **kwargs)
            finally:
                if self.llm_model.weights_version != version:
                    now = dict(model.named_parameters())
                    changed = [
                        n
                        for n, (p, v, ptr) in snap.items()
                        if now.get(n) is not p or p.data_ptr() != ptr or not torch.equal(p.detach(), v)
                    ]
                    self.records.append(
                        dict(
                            step=trainer.state.global_step,
                            merged=merged,
                            base=base,
                            changed=changed,
                            held=self.llm_model.hf_state_dict(),
                            names=list(self.llm_model.received_names[-1]),
                        )
                    )

        setattr(trainer, name, spy)


def _base_state(model):
    model = copy.deepcopy(peel(model, peft=False, fsdp=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.unload().state_dict() if hasattr(model, "unload") else model.state_dict()


def _lora_weights(names):
    return [n for n in names if n.endswith(".weight") and any(f".{t}." in n for t in TARGETS)]


def _patch_in_force():
    """The patch this TRL needs (from its version, so that a switched-off patch fails the test)."""
    needed = [pid for pid, status in _expected_status().items() if status == trl_compat.APPLIED]
    return needed[0] if needed else None


def test_trl_0_14_lora_vllm_bug_reproduced(tmp_path, unpatched):
    grpo_run = _grpo_or_skip()
    if _expected_status()[LORA_ID] != trl_compat.APPLIED:
        pytest.skip("vllm-lora-names is not needed with this TRL")
    with unpatched(LORA_ID):
        trainer = grpo_run.make_trainer(tmp_path, peft=True, use_vllm=True, steps=2)
        llm_model = trainer.llm.llm_engine.model_executor.driver_worker.model_runner.model
        with pytest.raises(ValueError, match=r"There is no module or parameter named 'base_model' in Qwen2ForCausalLM"):
            trainer.train()
    sent = llm_model.received_names[0]
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight" in sent
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in sent


def test_trl_0_15_0_vllm_gets_base_weights_bug_reproduced(tmp_path, unpatched):
    grpo_run = _grpo_or_skip()
    if _expected_status()[MERGED_ID] != trl_compat.APPLIED:
        pytest.skip("vllm-merged-weights is not needed with this TRL")
    with unpatched(MERGED_ID):
        trainer = grpo_run.make_trainer(tmp_path, peft=True, use_vllm=True, steps=2)
        spy = SyncSpy(trainer)
        trainer.train()
    assert len(spy.records) == 1  # step 1 (step 0 generates from the checkpoint vLLM loaded)
    rec = spy.records[0]
    for name in _lora_weights(rec["held"]):
        held, base, merged = rec["held"][name], rec["base"][name], rec["merged"][name]
        to_base, to_merged = (held - base).abs().max(), (held - merged).abs().max()
        assert to_merged > 1e-5 and to_base * 100 < to_merged, (name, float(to_base), float(to_merged))


def test_grpo_lora_vllm_patched(tmp_path):
    """3 GRPO steps with LoRA + use_vllm: after each sync the stand-in holds exactly the merged
    weights, and not one bit of the training model changed during the sync."""
    grpo_run = _grpo_or_skip()
    pid = _patch_in_force()
    if pid is None:
        pytest.skip("neither vLLM sync patch is needed with this TRL")
    trainer = grpo_run.make_trainer(tmp_path, peft=True, use_vllm=True, steps=3)
    spy = SyncSpy(trainer)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history)
    assert len(grpo_run.train_losses(trainer.state.log_history)) == 3
    assert [r["step"] for r in spy.records] == [1, 2]
    for rec in spy.records:
        assert rec["names"] == list(rec["merged"])  # plain Qwen2 names, nothing else
        held, merged = rec["held"], rec["merged"]
        for name, tensor in held.items():
            assert torch.equal(tensor, merged[name].to(tensor.dtype)), name
        assert any(not torch.equal(held[n], rec["base"][n].to(held[n].dtype)) for n in _lora_weights(held))
        assert rec["changed"] == []  # the sync (and the rest of that call) left every parameter as it was


# -- DeepSpeed ZeRO-3, 2 processes: per-layer gathers, in step on every rank ----------------------


def _zero3_worker(out_path):
    """One rank (run as ``torch.distributed.run ... tests/helpers/test_vllm_sync.py --zero3-worker OUT``)."""
    import json

    import deepspeed.comm.torch

    # DeepSpeed's CPU accelerator JIT-builds an optional shm op (a minute on 2 cores); gloo suffices.
    # (``import deepspeed.comm.torch as m`` would bind the torch package, hence sys.modules.)
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    import deepspeed
    import torch.distributed as dist

    from zero3_worker import serialise_all_gathers

    serialise_all_gathers()  # DeepSpeed 0.16's out-of-order gloo all-gathers (see zero3_worker)
    deepspeed.init_distributed("gloo")
    rank = dist.get_rank()
    model = _modules_to_save()  # LoRA on Linear + Embedding, a modules_to_save lm_head
    ref = reference_state(model)
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.0),
        config={
            "train_micro_batch_size_per_gpu": 1,
            "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
        },
    )
    q_proj = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight
    partitioned = hasattr(q_proj, "ds_id") and q_proj.numel() == 0

    class Receiver:
        def __init__(self):
            self.got, self.whole_when_received = {}, True

        def load_weights(self, weights):
            for name, tensor in weights:
                self.got[name] = tensor.detach().clone()
            return set(self.got)

    results = {"rank": rank, "partitioned": partitioned}
    # as TRL 0.14/0.15 hold it: trainer.model is the bare (partitioned) PeftModel
    receiver = Receiver() if rank == 0 else None
    trainer = types.SimpleNamespace(model=model, accelerator=types.SimpleNamespace(is_main_process=rank == 0), llm=None)
    if rank == 0:
        vllm_sync.trainer.vllm_model_of = lambda _trainer: receiver
    handled = vllm_sync.sync_trainer(trainer)
    # and through the DeepSpeed engine (unwrapped by the sync itself)
    receiver2 = Receiver() if rank == 0 else None
    vllm_sync.push_to_vllm(engine, receiver2, is_main=rank == 0)
    results["handled"] = handled
    results["still_partitioned"] = q_proj.numel() == 0
    with deepspeed.zero.GatheredParameters(list(model.parameters())):
        after = reference_state(model)
    results["unchanged"] = [n for n in ref if not torch.equal(ref[n], after[n])]
    if rank == 0:
        for key, rec in (("sync_trainer", receiver), ("engine", receiver2)):
            results[key] = {
                "names_ok": list(rec.got) == list(ref),
                "mismatched": [n for n in ref if n not in rec.got or not torch.equal(rec.got[n], ref[n])],
            }
    with open(f"{out_path}.{rank}", "w") as fh:
        json.dump(results, fh)
    dist.barrier()


@needs_peft
@only_in_cells(
    "trl0.15.2-tf4.48.3",
    "trl0.24.0-tf4.57.1",
    "trl1.0.0-tf4.57.6-ds0.19.2",
    "trl1.9.2-tf5.14.1-ds0.19.3",
    "trl-newest",
    # trl0.15.2-tf4.52.4 has trl0.15.2-tf4.48.3's DeepSpeed, trl0.19.1-tf5.23.0 trl-newest's stack
    why="one per DeepSpeed and peft release of the default run",
)
def test_zero3_two_ranks(tmp_path):
    import json
    import subprocess

    pytest.importorskip("deepspeed")
    env = child_env(OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", DS_ACCELERATOR="cpu", PYTHONUNBUFFERED="1", TRL_COMPAT_STRICT="1")
    out = tmp_path / "z3"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        os.path.abspath(__file__),
        "--zero3-worker",
        str(out),
    ]
    proc = subprocess.run(
        cmd,
        env=env,
        cwd=os.path.dirname(os.path.abspath(__file__)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    ranks = [json.loads(open(f"{out}.{r}").read()) for r in (0, 1)]
    for res in ranks:
        assert res["partitioned"] and res["still_partitioned"] and res["handled"], res
        assert res["unchanged"] == [], res  # the sync changed no parameter, on any rank
    for key in ("sync_trainer", "engine"):
        assert ranks[0][key] == {"names_ok": True, "mismatched": []}, ranks[0]


if __name__ == "__main__" and sys.argv[1:2] == ["--zero3-worker"]:
    _zero3_worker(sys.argv[2])
