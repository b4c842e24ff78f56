"""logits-to-keep: TRL's request for the last K+1 logits must reach the model under its own name.

What runs where (the same file in every cell):

* Mechanics (every cell with torch + transformers): a synthetic causal LM per naming convention,
  with the patch's TRL facts set by hand: rename in both directions, cut the logits for a model
  that takes neither name, idempotence, unchanged signature, ``copy.deepcopy``, unwrapping through
  PEFT / DataParallel / torch.compile, and revert.
* Real TRL code (cells in the window): the status expected for the installed versions, what the
  probe reads from TRL's source, and TRL's own log-prob code (``_get_per_token_logps`` in 0.15+,
  the function nested in ``compute_loss`` in 0.14.0, after the patched ``_prepare_inputs``) on
  a tiny Qwen2 and a tiny OPT (whose forward takes neither name; TrOCR on transformers 5.x,
  where OPT learnt logits_to_keep): the bug without the patch
  (full-length logits, wrong log-probs against an independent reference, TypeError,
  RuntimeError), and with it K+1 logits where the model can, log-probs equal to the reference.
* Real GRPO runs (cells where a mismatch exists): full fine-tuning and LoRA; every call TRL makes
  to the policy or the reference model is checked (logits length, log-probs vs the reference).
"""

import copy
import inspect
import types

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import trl_compat
from trl_compat._helpers.models import peel
from trl_compat.patches.logits_to_keep.accepts import MATCH, REFERENCE_MODEL, RENAME, SLICE, TRL_SLICES, UNKNOWN, Accepts, accepts
from trl_compat.patches.logits_to_keep.forward import _PREV, SWITCH, _ours, unwrap_all, wrapped_models
from trl_compat.patches.logits_to_keep.prepare import decisions, prepare_model
from trl_compat.patches.logits_to_keep.trl_call import NEW, OLD, TrlCall, read_trl

from packaging.version import Version

PID = "logits-to-keep"
TF = Version(transformers.__version__)
OLD_TF = TF < Version("4.49")  # Qwen2/Llama take only num_logits_to_keep
SHIM_TF = Version("4.49") <= TF < Version("4.52")  # both names (deprecate_kwarg)
NEW_TF = TF >= Version("4.52")  # only logits_to_keep

try:
    import trl

    TRL = Version(trl.__version__)
except ImportError:
    TRL = None
IN_WINDOW = TRL is not None and Version("0.14.0.dev0") <= TRL < Version("0.20")
T014 = IN_WINDOW and TRL.release[:2] == (0, 14)  # num_logits_to_keep, no fallback slice
T019 = IN_WINDOW and TRL.release[:2] == (0, 19)  # logits_to_keep, no fallback slice
MID = IN_WINDOW and not (T014 or T019)  # 0.15-0.18: logits_to_keep + fallback slice

needs_trl = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL} is not installed or outside 0.14-0.19")

# Qwen2 takes a name TRL does not pass: 0.14.0 on >=4.52 (wrong values), 0.15-0.18 on <=4.48 (memory).
QWEN2_MISMATCH = (T014 and NEW_TF) or (MID and OLD_TF)


def _takes_neither(cls):
    params = inspect.signature(cls.forward).parameters
    return NEW not in params and OLD not in params


def neither_class():
    """A real causal LM whose forward takes neither logits_to_keep nor num_logits_to_keep: OPT up
    to transformers 4.53 (GPT-2 would do up to 4.52), else TrOCRForCausalLM (transformers 5.x gave
    OPT and GPT-2 logits_to_keep). None if this transformers has neither such model."""
    import transformers

    for name in ("OPTForCausalLM", "TrOCRForCausalLM"):
        cls = getattr(transformers, name, None)
        if cls is not None and _takes_neither(cls):
            return cls
    return None


NEITHER = neither_class()
NEITHER_ARCH = {"OPTForCausalLM": "opt", "TrOCRForCausalLM": "trocr"}.get(getattr(NEITHER, "__name__", ""), "")
needs_neither = pytest.mark.skipif(
    NEITHER is None, reason=f"transformers {TF} has no tiny-buildable causal LM whose forward lacks both names"
)


def neither_has_var_kw():
    """OPT has **kwargs from transformers 4.48 on; on 4.46.3 it has none, so an unknown kwarg is a TypeError."""
    params = inspect.signature(NEITHER.forward).parameters.values()
    return any(p.kind == p.VAR_KEYWORD for p in params)


# -- models and the independent reference -----------------------------------------------------


def make_qwen2():
    import tiny

    return tiny.make_model("qwen2")


def make_neither(dtype=torch.float32):
    """A tiny ``NEITHER`` model (vocab 512, like the tiny tokenizer), dropout off."""
    from transformers import OPTConfig, TrOCRConfig

    if NEITHER_ARCH == "opt":
        config = OPTConfig(
            vocab_size=512,
            hidden_size=64,
            num_hidden_layers=2,
            ffn_dim=128,
            num_attention_heads=4,
            max_position_embeddings=64,
            word_embed_proj_dim=64,
            dropout=0.0,
            attention_dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
        )
    else:
        config = TrOCRConfig(
            vocab_size=512,
            d_model=64,
            decoder_layers=2,
            decoder_attention_heads=4,
            decoder_ffn_dim=128,
            max_position_embeddings=64,
            dropout=0.0,
            attention_dropout=0.0,
            activation_dropout=0.0,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=1,
            decoder_start_token_id=1,
            use_learned_position_embeddings=True,
        )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = NEITHER(config)
    return model.to(dtype).eval()


MODELS = {"qwen2": make_qwen2, "opt": make_neither, "trocr": make_neither}


def batch(length=12, completion=5, batch_size=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 512, (batch_size, length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0  # one left-padded row
    return ids, mask, completion


def reference_logps(model, ids, mask, k):
    """Log-probs of the last k tokens from a plain forward (no logits kwarg): the ground truth."""
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    logps = logits[:, -k - 1 : -1].float().log_softmax(-1)
    return torch.gather(logps, 2, ids[:, -k:, None])[..., 0]


class LmHeadRows:
    """Rows the lm_head computed in the last forward (a module hook: lm_head is called as a module)."""

    def __init__(self, model):
        self.rows = []
        peel(model).lm_head.register_forward_hook(lambda mod, inp, out: self.rows.append(out.shape[1]))


# -- TRL's own log-prob code -------------------------------------------------------------------


def grpo_module():
    from trl.trainer import grpo_trainer

    return grpo_trainer


def nested_get_per_token_logps():
    """TRL 0.14.0's ``get_per_token_logps``, built from the code object nested in ``compute_loss``."""
    gt = grpo_module()
    outer = inspect.unwrap(gt.GRPOTrainer.compute_loss)
    code = next(c for c in outer.__code__.co_consts if isinstance(c, types.CodeType) and c.co_name == "get_per_token_logps")
    assert not code.co_freevars
    return types.FunctionType(code, outer.__globals__)


def trl_logps(model, ids, mask, k):
    """Per-token log-probs computed by the installed TRL's code, entered the way TRL enters it."""
    gt = grpo_module()
    if T014:
        # As in training_step/prediction_step: _prepare_inputs (the patched entry, which prepares
        # the trainer's models), then compute_loss's nested function.
        stub = types.SimpleNamespace(model=model, model_wrapped=model, ref_model=None)
        assert gt.GRPOTrainer._prepare_inputs(stub, ["inputs"]) == ["inputs"]
        return nested_get_per_token_logps()(model, ids, k)
    stub = types.SimpleNamespace(temperature=1.0, args=types.SimpleNamespace(report_to=[]))
    return gt.GRPOTrainer._get_per_token_logps(stub, model, ids, mask, k)


def trl_postprocess(logits, ids, mask, k):
    """What TRL's code makes of `logits` returned by the model (its real code, fake model)."""
    fake = lambda *args, **kwargs: types.SimpleNamespace(logits=logits)  # noqa: E731
    if T014:
        return nested_get_per_token_logps()(fake, ids, k)
    stub = types.SimpleNamespace(temperature=1.0, args=types.SimpleNamespace(report_to=[]))
    return inspect.unwrap(grpo_module().GRPOTrainer._get_per_token_logps)(stub, fake, ids, mask, k)


def seen_mask(mask):
    """The attention mask TRL's code gives the model (0.14.0 passes none: pads are attended to)."""
    return torch.ones_like(mask) if T014 else mask


def max_err(a, b):
    return (a.float() - b.float()).abs().max().item()


# -- mechanics on synthetic models (every cell) --------------------------------------------------


class _LM(torch.nn.Module):
    """A causal LM head over an embedding; slices like transformers does when told to."""

    def __init__(self):
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            self.embed = torch.nn.Embedding(32, 8)
            self.lm_head = torch.nn.Linear(8, 32)
        self.calls = []

    def _out(self, input_ids, keep):
        from transformers.modeling_outputs import CausalLMOutputWithPast

        hidden = self.embed(input_ids).cumsum(1)
        sl = slice(-keep, None) if isinstance(keep, int) else keep
        return CausalLMOutputWithPast(logits=self.lm_head(hidden[:, sl, :]))


class NewLM(_LM):
    def forward(self, input_ids, attention_mask=None, logits_to_keep=0, **kwargs):
        self.calls.append(dict(kwargs, logits_to_keep=logits_to_keep))
        return self._out(input_ids, logits_to_keep)


class OldLM(_LM):
    def forward(self, input_ids, attention_mask=None, num_logits_to_keep=0, **kwargs):
        self.calls.append(dict(kwargs, num_logits_to_keep=num_logits_to_keep))
        return self._out(input_ids, num_logits_to_keep)


class NeitherKwLM(_LM):
    def forward(self, input_ids, attention_mask=None, **kwargs):
        self.calls.append(dict(kwargs))
        return self._out(input_ids, 0)


class NeitherStrictLM(_LM):
    def forward(self, input_ids, attention_mask=None):
        self.calls.append({})
        return self._out(input_ids, 0)


@pytest.fixture
def facts():
    """Switch the per-model machinery on with given TRL facts; afterwards the switch is put back
    exactly as it was (the engine may own it) and the models wrapped meanwhile are restored."""
    had = "active" in vars(SWITCH)
    old = vars(SWITCH).get("active")

    def set_facts(passed, fallback):
        SWITCH.active = TrlCall(passed, fallback, "_get_per_token_logps", "_get_per_token_logps")

    yield set_facts
    if had:
        SWITCH.active = old
    elif "active" in vars(SWITCH):
        del SWITCH.active
    unwrap_all()


IDS = torch.arange(1, 13).reshape(2, 6) % 31 + 1


@pytest.mark.parametrize(
    "cls,passed,action,seen",
    [
        (OldLM, NEW, RENAME, {"num_logits_to_keep": 3}),  # TRL 0.15-0.18 on transformers <= 4.48
        (NewLM, OLD, RENAME, {"logits_to_keep": 3}),  # TRL 0.14.0 on transformers >= 4.52
        (NewLM, NEW, MATCH, {"logits_to_keep": 3}),
        (OldLM, OLD, MATCH, {"num_logits_to_keep": 3}),
        (NeitherKwLM, NEW, SLICE, {"logits_to_keep": 3}),  # kept: **kwargs may pass it on
        (NeitherStrictLM, OLD, SLICE, {}),  # dropped: it would raise TypeError
    ],
)
def test_synthetic_forward_gets_the_request(facts, cls, passed, action, seen):
    facts(passed, fallback=False)
    model = cls()
    expected = model._out(IDS, 3).logits
    assert prepare_model(model) == action
    assert ("forward" in vars(model)) == (action != MATCH)  # names match: nothing is wrapped
    out = model(input_ids=IDS, **{passed: 3})
    assert model.calls[-1] == seen
    assert out.logits.shape == (2, 3, 32)
    torch.testing.assert_close(out.logits, expected)
    assert out["logits"] is out.logits  # ModelOutput's key and attribute stay in step


def test_synthetic_neither_with_fallback_is_left_to_trl(facts):
    facts(NEW, fallback=True)
    model = NeitherKwLM()
    assert prepare_model(model) == TRL_SLICES
    assert "forward" not in vars(model)
    strict = NeitherStrictLM()  # TRL's fallback cannot save a forward that raises
    assert prepare_model(strict) == SLICE
    with pytest.raises(TypeError):
        NeitherStrictLM()(input_ids=IDS, logits_to_keep=3)
    assert strict(input_ids=IDS, logits_to_keep=3).logits.shape[1] == 3


def test_synthetic_tensor_request_on_old_model_is_sliced(facts):
    facts(NEW, fallback=False)
    model = OldLM()
    prepare_model(model)
    keep = torch.tensor([0, 2, 4])
    out = model(input_ids=IDS, logits_to_keep=keep)
    assert model.calls[-1] == {"num_logits_to_keep": 0}  # num_logits_to_keep only took ints
    torch.testing.assert_close(out.logits, model._out(IDS, 0).logits[:, keep])


def test_wrapping_is_idempotent_keeps_signature_and_only_acts_on_the_request(facts):
    facts(NEW, fallback=False)
    model = OldLM()
    signature = inspect.signature(model.forward)
    prepare_model(model)
    forward = vars(model)["forward"]
    prepare_model(model)
    prepare_model(torch.nn.DataParallel(model))
    assert vars(model)["forward"] is forward
    assert [m for m in wrapped_models() if m is model] == [model]
    assert inspect.signature(model.forward) == signature
    model(input_ids=IDS)  # without TRL's kwarg: passed through untouched
    assert model.calls[-1] == {"num_logits_to_keep": 0}


def test_deepcopy_rebinds_to_the_copy(facts):
    facts(NEW, fallback=False)
    model = OldLM()
    prepare_model(model)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.bias.add_(1.0)
    assert twin.forward.__self__ is twin
    out, out_twin = model(input_ids=IDS, logits_to_keep=2), twin(input_ids=IDS, logits_to_keep=2)
    assert out_twin.logits.shape[1] == 2 and twin.calls and twin.calls[-1] == {"num_logits_to_keep": 2}
    torch.testing.assert_close(out_twin.logits, out.logits + 1.0)


def test_on_top_of_accelerate_mixed_precision(facts):
    """accelerate's prepare() replaces the instance forward for mixed precision (autocast +
    convert_outputs_to_fp32) and unwrap_model(keep_fp32_wrapper=False) strips wrappers again."""
    pytest.importorskip("accelerate")
    from accelerate.utils import convert_outputs_to_fp32, extract_model_from_parallel

    facts(NEW, fallback=False)
    model = OldLM()
    signature = inspect.signature(model.forward)
    model._original_forward = model.forward  # what Accelerator.prepare_model does with native AMP
    autocast = torch.autocast("cpu", dtype=torch.bfloat16)(model.forward.__func__)
    model.forward = types.MethodType(convert_outputs_to_fp32(autocast), model)
    assert prepare_model(model) == RENAME
    out = model(input_ids=IDS, logits_to_keep=3)
    assert model.calls[-1] == {"num_logits_to_keep": 3}
    assert out.logits.shape[1] == 3 and out.logits.dtype == torch.float32  # accelerate's wrapper still ran
    assert inspect.signature(model.forward) == signature
    extract_model_from_parallel(model, keep_fp32_wrapper=False)  # may strip ours along with accelerate's
    assert prepare_model(model) == RENAME  # put back lazily at TRL's next call, once
    assert model(input_ids=IDS, logits_to_keep=2).logits.shape[1] == 2
    assert model.calls[-1] == {"num_logits_to_keep": 2}


def test_peft_calls_the_instance_forward(facts):
    """PEFT's BaseTuner.forward calls ``self.model.forward`` directly: a module pre-hook would be
    bypassed, the instance forward is not."""
    peft = pytest.importorskip("peft")
    if SHIM_TF:
        pytest.skip(f"transformers {TF}: Qwen2 takes both names, so nothing needs passing on")
    passed = OLD if NEW_TF else NEW
    facts(passed, fallback=False)
    model = make_qwen2()
    rows = LmHeadRows(model)
    hook_calls = []
    model.register_forward_pre_hook(lambda mod, args: hook_calls.append(1))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    assert prepare_model(wrapped) == RENAME
    ids, mask, k = batch()
    wrapped(input_ids=ids, attention_mask=mask, **{passed: k + 1})
    assert rows.rows[-1] == k + 1
    from peft.tuners.tuners_utils import BaseTuner

    if "self.model.forward(" in inspect.getsource(BaseTuner.forward):  # peft <= 0.17 at least
        assert hook_calls == []  # a forward pre-hook would never have run


def test_unwrap_all_restores_and_buried_wrappers_pass_through(facts):
    facts(NEW, fallback=False)
    model, other = OldLM(), OldLM()
    prepare_model(model)
    prepare_model(other)
    ours = other.forward
    other.forward = types.MethodType(lambda self, *a, **k: ours(*a, **k), other)  # someone wraps ours
    SWITCH.__delattr__("active")  # what revert() does
    assert "forward" not in vars(model) and _PREV not in vars(model)
    assert other(input_ids=IDS, logits_to_keep=2).logits.shape[1] == 6  # switched off: original behaviour
    assert other.calls[-1] == {"logits_to_keep": 2, "num_logits_to_keep": 0}


def test_prepare_never_raises(facts):
    facts(NEW, fallback=False)
    assert prepare_model(None) is None
    assert prepare_model(object()) == UNKNOWN


# -- the transformers side -------------------------------------------------------------------------


def test_accepted_names_of_the_installed_causal_lms():
    from transformers import GPT2LMHeadModel, LlamaForCausalLM, OPTForCausalLM, Qwen2ForCausalLM

    expected = {OLD} if OLD_TF else {NEW, OLD} if SHIM_TF else {NEW}
    for cls in (Qwen2ForCausalLM, LlamaForCausalLM):
        assert accepts(cls).names == expected, cls
    if TF < Version("4.54"):  # the releases pinned in the matrix; later ones gave OPT logits_to_keep too
        assert NEITHER is OPTForCausalLM
        assert accepts(OPTForCausalLM) == Accepts(frozenset(), neither_has_var_kw())
        assert accepts(GPT2LMHeadModel).names == ({NEW} if TF >= Version("4.53") else set())


# -- the real TRL code -------------------------------------------------------------------------------


def expected_status():
    if not IN_WINDOW:
        return trl_compat.NOT_NEEDED
    if T014 or T019:
        return trl_compat.APPLIED  # no fallback slice: any model lacking TRL's name is wrong
    return trl_compat.APPLIED if OLD_TF else trl_compat.NOT_NEEDED


@needs_trl
def test_probe_reads_trl_source():
    facts, why = read_trl(grpo_module())
    assert facts is not None, why
    if T014:
        assert facts == TrlCall(OLD, False, "_prepare_inputs", "compute_loss")
    else:
        assert facts == TrlCall(NEW, MID, "_get_per_token_logps", "_get_per_token_logps")


@needs_trl
def test_qwen2_under_trl(unpatched):
    """Qwen2 with TRL's real log-prob code: the mismatch without the patch, the fix with it, and
    "nothing wrapped" where the names match."""
    model = make_qwen2().eval()
    rows = LmHeadRows(model)
    ids, mask, k = batch()
    ref = reference_logps(model, ids, seen_mask(mask), k)
    if not QWEN2_MISMATCH:
        got = trl_logps(model, ids, mask, k)
        assert rows.rows[-1] == k + 1
        assert max_err(got, ref) < 1e-4
        assert "forward" not in vars(model)
        if trl_compat.status(PID) == trl_compat.APPLIED:
            assert decisions()["transformers.models.qwen2.modeling_qwen2.Qwen2ForCausalLM"] == MATCH
        return
    with unpatched(PID):
        got = trl_logps(model, ids, mask, k)
        assert rows.rows[-1] == ids.shape[1]  # full [B, L, V] logits
        if T014:
            assert max_err(got, ref) > 1e-2  # log-probs of prompt positions: silently wrong
        else:
            assert max_err(got, ref) < 1e-4  # TRL's fallback slice: right, but the memory is spent
    got = trl_logps(model, ids, mask, k)
    assert rows.rows[-1] == k + 1
    assert max_err(got, ref) < 1e-4
    assert "forward" in vars(model)


@needs_trl
@needs_neither
def test_neither_name_under_trl(unpatched):
    """A model whose forward takes neither name (OPT; TrOCR on transformers 5.x)."""
    model = make_neither()
    ids, mask, k = batch()
    ref = reference_logps(model, ids, seen_mask(mask), k)
    passed = OLD if T014 else NEW
    if MID and neither_has_var_kw():  # TRL's fallback slice handles it; nothing to do
        assert max_err(trl_logps(model, ids, mask, k), ref) < 1e-4
        assert "forward" not in vars(model)
        return
    with unpatched(PID):
        if not neither_has_var_kw():
            with pytest.raises(TypeError, match=f"unexpected keyword argument '{passed}'"):
                trl_logps(model, ids, mask, k)
        elif T019:
            with pytest.raises(RuntimeError, match="must match the size of tensor"):
                trl_logps(model, ids, mask, k)
        else:  # 0.14.0: no error, log-probs of the first k positions
            assert max_err(trl_logps(model, ids, mask, k), ref) > 1e-2
    got = trl_logps(model, ids, mask, k)
    assert max_err(got, ref) < 1e-4
    assert decisions()[f"{NEITHER.__module__}.{NEITHER.__qualname__}"] == SLICE


@pytest.mark.skipif(not T019, reason="TRL 0.19.x only (fallback slice removed)")
@needs_neither
def test_neither_name_bf16_is_silently_misaligned_without_the_patch(unpatched):
    model = make_neither(torch.bfloat16)
    ids, mask, k = batch(length=24, completion=6)
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits
    from trl.trainer.utils import selective_log_softmax

    ref = selective_log_softmax(full[:, -k - 1 : -1], ids[:, -k:])  # TRL's own bf16 path, right positions
    with unpatched(PID):
        assert max_err(trl_logps(model, ids, mask, k), ref) > 0.1  # no error raised, values wrong
    assert max_err(trl_logps(model, ids, mask, k), ref) == 0.0


# -- real GRPO runs ------------------------------------------------------------------------------------

RUNS = []
if QWEN2_MISMATCH:
    RUNS += [("qwen2", False), ("qwen2", True)]
if IN_WINDOW and NEITHER is not None and (T014 or T019 or (MID and not neither_has_var_kw())):
    RUNS += [(NEITHER_ARCH, False), (NEITHER_ARCH, True)]


class CallChecker:
    """Forward hooks on the models TRL calls: for every log-prob call (TRL's kwarg, no KV cache),
    the rows the model returned and the log-probs TRL's own code makes of them, against the reference."""

    def __init__(self, trainer, passed):
        self.passed, self.calls = passed, []
        models = [("policy", trainer.model)]
        if getattr(trainer, "ref_model", None) is not None:
            models.append(("ref", trainer.ref_model))
        for role, model in models:
            model.register_forward_hook(self._hook(role), with_kwargs=True)

    def _hook(self, role):
        def hook(module, args, kwargs, output):
            keep = kwargs.get(self.passed)
            if not isinstance(keep, int) or keep < 2 or kwargs.get("past_key_values") is not None:
                return  # a generation step, not a log-prob call
            k = keep - 1
            ids = kwargs.get("input_ids", args[0] if args else None)
            mask = kwargs.get("attention_mask")
            trl_out = trl_postprocess(output.logits.detach(), ids, mask, k)
            ref = reference_logps(module, ids, mask if mask is not None else torch.ones_like(ids), k)
            who = role
            if any(getattr(m, "disable_adapters", False) is True for m in module.modules()):
                who = "ref"  # PEFT: the reference is the policy with its adapters disabled
            self.calls.append((who, output.logits.shape[1], k, max_err(trl_out, ref)))

        return hook


@needs_trl
@pytest.mark.skipif(not RUNS, reason="no name mismatch for Qwen2 or a model lacking both names with these versions")
@pytest.mark.parametrize("arch,lora", RUNS, ids=[f"{a}-{'lora' if lo else 'full'}" for a, lo in RUNS])
def test_grpo_run(tmp_path, arch, lora):
    import grpo_run

    peft_config = None
    if lora:
        LoraConfig = pytest.importorskip("peft").LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    model = MODELS[arch]()
    trainer = grpo_run.make_trainer(tmp_path, model=model, peft_config=peft_config, steps=2, beta=0.04)
    checker = CallChecker(trainer, OLD if T014 else NEW)
    trainer.train()
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert checker.calls, "TRL never called the model with its logits kwarg"
    # the policy and the reference (a separate model, or the policy with adapters disabled)
    assert {role for role, _, _, _ in checker.calls} == {"policy", "ref"}, checker.calls
    for role, rows, k, err in checker.calls:
        assert err < 1e-4, (role, err)  # the log-probs TRL trains on
        assert rows == k + 1, (role, rows, k)  # the logits it got
    inner = peel(trainer.model)
    assert _ours(vars(inner).get("forward"))
    # the report's reason names the class TRL really called, not only the probe's reference
    reason = {r.id: r.reason for r in trl_compat.report()}["logits-to-keep"]
    decided = reason.partition("; models decided: ")[2]  # this session's classes, in name order
    action = decisions()[f"{type(inner).__module__}.{type(inner).__qualname__}"]
    assert f"{type(inner).__name__}: {action}" in decided.split(", "), reason
    # the probe's reference class is named only as the reference, never as the model trained
    said = reason.partition("; models decided: ")[0]
    assert REFERENCE_MODEL not in said or f"as read from {REFERENCE_MODEL}" in said, reason


def test_the_entry_falls_back_to_trl_when_preparing_a_model_fails(facts, monkeypatch, caplog):
    """Preparing the models is the wrapper's own bookkeeping (``_engine.guarded``): if it fails,
    TRL's method runs unchanged and the failure is logged once, with its cause."""
    import logging

    from trl_compat.patches.logits_to_keep import prepare

    def broken(model):
        raise RuntimeError("cannot prepare")

    def original(self, model, input_ids):
        return ("trl", model, input_ids)

    facts("logits_to_keep", False)
    monkeypatch.delenv("TRL_COMPAT_STRICT", raising=False)
    monkeypatch.setattr(prepare, "prepare_model", broken)
    entry = prepare.wrap_entry(original, SWITCH.active)
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        assert entry(object(), "the model", input_ids=1) == ("trl", "the model", 1)
    assert "logits-to-keep: preparing the model failed (RuntimeError: cannot prepare); TRL runs unchanged" in caplog.text
