"""Stand-in for vLLM 0.7.2's packed Qwen2 / Llama model classes and their ``load_weights`` path.

Reproduced from ``vllm/model_executor/models/{qwen2,llama,utils}.py``,
``vllm/model_executor/layers/{linear,vocab_parallel_embedding,layernorm}.py`` and
``vllm/model_executor/model_loader/weight_utils.py`` of vLLM 0.7.2, at tensor-parallel size 1 and
pipeline-parallel size 1, without quantization:

* parameter layout: ``qkv_proj`` packs rows q, k, v; ``gate_up_proj`` packs rows gate, up;
  ``embed_tokens`` / ``lm_head`` are padded to a multiple of 64 rows (``VocabParallelEmbedding``);
* ``<Root>.load_weights`` goes through ``AutoWeightsLoader`` (prefix routing by first dotted
  component, ``lm_head.`` skipped when embeddings are tied, ``ValueError("There is no module or
  parameter named '<prefix>' in <Root>")`` (from vLLM 0.15.0 followed by ``". The available parameters
  belonging to <prefix> (<Module>) are: {<names>}"``), nested-into-parameter ``ValueError``);
* ``Qwen2Model.load_weights`` / ``LlamaModel.load_weights``: ``rotary_emb.inv_freq`` skipped, the
  plain-substring q/k/v -> ``qkv_proj`` and gate/up -> ``gate_up_proj`` rewrite, unknown names
  raise a bare ``KeyError(<rewritten name>)`` (from vLLM 0.13.0 Qwen2 skips an unknown name that is
  not a q/k/v/gate/up one: not accepted, no error), extra ``.bias`` names skipped silently;
* the shard weight loaders' ``narrow`` + bare ``assert param_data.shape == loaded_weight.shape``
  (so a too-small tensor gives ``RuntimeError: start (0) + length (N) exceeds dimension size (M).``
  and a too-large one is silently truncated along the sharded dim, exactly like vLLM at tp=1),
  ``default_weight_loader``'s ``"Attempted to load weight (...) into parameter (...)"``, and the
  vocab loader's bare ``assert loaded_weight.shape[0] == org_vocab_size``.

Not reproduced: the forward pass (the stand-in ``LLM`` generates with a Hugging Face model whose
weights are unpacked from these parameters: ``hf_state_dict()``), quantization, kv-cache scales,
tensor/pipeline parallelism, LoRA, and any other architecture.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..engine.arg_utils import installed_version

DEFAULT_VOCAB_PADDING_SIZE = 64


# --------------------------------------------------------------------------------------------------
# vllm/model_executor/utils.py + model_loader/weight_utils.py
# --------------------------------------------------------------------------------------------------
def set_weight_attrs(weight: torch.Tensor, weight_attrs: dict[str, Any] | None) -> None:
    if weight_attrs is None:
        return
    for key, value in weight_attrs.items():
        assert not hasattr(weight, key), f"Overwriting existing tensor attribute: {key}"
        setattr(weight, key, value)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Default weight loader (vLLM 0.7.2 ``weight_utils.default_weight_loader``)."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        # Sometimes scalar values aren't considered tensors with shapes, so if both param and
        # loaded_weight are a scalar, "broadcast" instead of copy.
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), (
            f"Attempted to load weight ({loaded_weight.size()}) into parameter ({param.size()})"
        )
        param.data.copy_(loaded_weight)


def maybe_remap_kv_scale_name(name: str, params_dict: dict) -> str | None:
    """vLLM 0.7.2: kv-cache scale names are remapped; without quantization they are never params,
    so a ``*.kv_scale`` / ``*.k_scale`` / ``*.v_scale`` name maps to ``None`` (skipped)."""
    if name.endswith(".kv_scale"):
        remapped = name.replace(".kv_scale", ".attn.k_scale")
        return remapped if remapped in params_dict else None
    for scale in (".k_scale", ".v_scale"):
        if name.endswith(scale):
            remapped = name.replace(scale, f".attn{scale}")
            if remapped in params_dict:
                return remapped
            return name if name in params_dict else None
    return name


# --------------------------------------------------------------------------------------------------
# layers (tp = 1)
# --------------------------------------------------------------------------------------------------
def _param(*shape: int, dtype: torch.dtype, fill: float | None = None) -> nn.Parameter:
    data = torch.zeros(*shape, dtype=dtype) if fill is None else torch.full(shape, fill, dtype=dtype)
    return nn.Parameter(data, requires_grad=False)


class RowParallelLinear(nn.Module):
    """``o_proj`` / ``down_proj``: weight ``[out, in]`` sharded along ``input_dim=1``."""

    def __init__(self, input_size: int, output_size: int, bias: bool, dtype: torch.dtype):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.weight = _param(output_size, input_size, dtype=dtype)
        set_weight_attrs(self.weight, {"input_dim": 1, "output_dim": 0, "weight_loader": self.weight_loader})
        if bias:
            self.bias = _param(output_size, dtype=dtype)
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        tp_rank = 0
        input_dim = getattr(param, "input_dim", None)
        param_data = param.data
        if input_dim is not None:
            shard_size = param_data.shape[input_dim]
            start_idx = tp_rank * shard_size
            loaded_weight = loaded_weight.narrow(input_dim, start_idx, shard_size)
        # Special case for loading scales off disk, which often do not have a shape.
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class _PackedColumnLinear(nn.Module):
    """Common part of ``QKVParallelLinear`` and ``MergedColumnParallelLinear``: weight
    ``[sum(output_sizes), in]`` sharded along ``output_dim=0``."""

    shard_ids: tuple = ()

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, dtype: torch.dtype):
        super().__init__()
        self.input_size = input_size
        self.output_sizes = list(output_sizes)
        self.weight = _param(sum(output_sizes), input_size, dtype=dtype)
        set_weight_attrs(self.weight, {"input_dim": 1, "output_dim": 0, "weight_loader": self.weight_loader})
        if bias:
            self.bias = _param(sum(output_sizes), dtype=dtype)
            set_weight_attrs(self.bias, {"output_dim": 0, "weight_loader": self.weight_loader})
        else:
            self.register_parameter("bias", None)

    def _shard_offset_size(self, shard_id) -> tuple[int, int]:
        index = self.shard_ids.index(shard_id)
        return sum(self.output_sizes[:index]), self.output_sizes[index]

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, loaded_shard_id=None) -> None:
        tp_rank = 0
        param_data = param.data
        output_dim = getattr(param, "output_dim", None)
        if loaded_shard_id is None:
            # Loaded weight is already fused on disk.
            if output_dim is None:
                if len(param_data.shape) == 0:
                    param_data = param_data.reshape(1)
                if len(loaded_weight.shape) == 0:
                    loaded_weight = loaded_weight.reshape(1)
                assert param_data.shape == loaded_weight.shape
                param_data.copy_(loaded_weight)
                return
            for shard_id in self.shard_ids:
                shard_offset, shard_size = self._shard_offset_size(shard_id)
                loaded_weight_shard = loaded_weight.narrow(output_dim, shard_offset, shard_size)
                self.weight_loader(param, loaded_weight_shard, shard_id)
            return
        assert loaded_shard_id in self.shard_ids
        if output_dim is not None:
            shard_offset, shard_size = self._shard_offset_size(loaded_shard_id)
            param_data = param_data.narrow(output_dim, shard_offset, shard_size)
            start_idx = tp_rank * shard_size
            loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class QKVParallelLinear(_PackedColumnLinear):
    shard_ids = ("q", "k", "v")

    def __init__(self, hidden_size: int, head_size: int, num_heads: int, num_kv_heads: int, bias: bool, dtype: torch.dtype):
        self.head_size, self.num_heads, self.num_kv_heads = head_size, num_heads, num_kv_heads
        super().__init__(hidden_size, [num_heads * head_size, num_kv_heads * head_size, num_kv_heads * head_size], bias, dtype)


class MergedColumnParallelLinear(_PackedColumnLinear):
    shard_ids = (0, 1)


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    return ((vocab_size + pad_to - 1) // pad_to) * pad_to


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, dtype: torch.dtype, padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__()
        self.org_vocab_size = num_embeddings
        self.num_embeddings_padded = pad_vocab_size(num_embeddings, padding_size)
        self.embedding_dim = embedding_dim
        self.weight = _param(self.num_embeddings_padded, embedding_dim, dtype=dtype)
        set_weight_attrs(self.weight, {"output_dim": 0, "input_dim": 1, "weight_loader": self.weight_loader})

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
        output_dim = getattr(param, "output_dim", None)
        if output_dim is None:
            assert param.data.shape == loaded_weight.shape, (
                f"'param.data.shape' = {param.data.shape} and 'loaded_weight.shape' = {loaded_weight.shape}"
            )
            param.data.copy_(loaded_weight)
            return
        start_idx, shard_size = 0, self.org_vocab_size
        assert loaded_weight.shape[output_dim] == self.org_vocab_size
        loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        param[: loaded_weight.shape[0]].data.copy_(loaded_weight)
        param[loaded_weight.shape[0] :].data.fill_(0)


class ParallelLMHead(VocabParallelEmbedding):
    pass


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=dtype), requires_grad=False)


class RotaryEmbedding(nn.Module):
    """No parameters (vLLM keeps ``cos_sin_cache`` as a non-persistent buffer)."""


class Attention(nn.Module):
    """No parameters without kv-cache quantization."""


class SiluAndMul(nn.Module):
    pass


class LogitsProcessor(nn.Module):
    pass


class Sampler(nn.Module):
    pass


class PPMissingLayer(nn.Identity):
    pass


# --------------------------------------------------------------------------------------------------
# vllm/model_executor/models/utils.py: AutoWeightsLoader
# --------------------------------------------------------------------------------------------------
class AutoWeightsLoader:
    """vLLM 0.7.2 ``AutoWeightsLoader`` (logging left out)."""

    def __init__(
        self, module: nn.Module, *, skip_prefixes: list[str] | None = None, ignore_unexpected_prefixes: list[str] | None = None
    ) -> None:
        self.module = module
        self.skip_prefixes = skip_prefixes or []
        self.ignore_unexpected_prefixes = ignore_unexpected_prefixes or []

    def _groupby_prefix(self, weights):
        weights_by_parts = ((name.split(".", 1), data) for name, data in weights)
        for prefix, group in itertools.groupby(weights_by_parts, key=lambda x: x[0][0]):
            yield (prefix, (("" if len(parts) == 1 else parts[1], data) for parts, data in group))

    def _get_qualname(self, prefix: str, rest: str) -> str:
        if prefix == "":
            return rest
        if rest == "":
            return prefix
        return ".".join((prefix, rest))

    def _can_skip(self, qualname: str) -> bool:
        return any(qualname.startswith(p) for p in self.skip_prefixes)

    def _can_ignore_unexpected(self, qualname: str) -> bool:
        return any(qualname.startswith(p) for p in self.ignore_unexpected_prefixes)

    def _load_param(self, base_prefix: str, param: nn.Parameter, weights):
        for weight_name, weight_data in weights:
            weight_qualname = self._get_qualname(base_prefix, weight_name)
            if self._can_skip(weight_qualname):
                continue
            if weight_name != "":
                if self._can_ignore_unexpected(weight_qualname):
                    continue
                raise ValueError(f"Attempted to load nested weight '{weight_qualname}' into a single parameter '{base_prefix}'")
            weight_loader = getattr(param, "weight_loader", default_weight_loader)
            weight_loader(param, weight_data)
            yield weight_qualname

    def _load_module(self, base_prefix: str, module: nn.Module, weights):
        if isinstance(module, PPMissingLayer):
            return
        # Avoid infinite recursion since this function is typically called inside load_weights of
        # the module itself.
        if module != self.module:
            module_load_weights = getattr(module, "load_weights", None)
            if callable(module_load_weights):
                loaded_params = module_load_weights(weights)
                if loaded_params is not None:
                    yield from (self._get_qualname(base_prefix, x) for x in loaded_params)
        child_modules = dict(module.named_children())
        child_params = dict(module.named_parameters(recurse=False))
        for child_prefix, child_weights in self._groupby_prefix(weights):
            prefix = self._get_qualname(base_prefix, child_prefix)
            if child_prefix in child_modules:
                if self._can_skip(prefix + "."):
                    continue
                yield from self._load_module(prefix, child_modules[child_prefix], child_weights)
            elif child_prefix in child_params:
                if self._can_skip(prefix):
                    continue
                yield from self._load_param(prefix, child_params[child_prefix], child_weights)
            else:
                if self._can_skip(prefix + ".") or self._can_skip(prefix):
                    continue
                if self._can_ignore_unexpected(prefix + ".") or self._can_ignore_unexpected(prefix):
                    continue
                message = f"There is no module or parameter named '{prefix}' in {type(self.module).__name__}"
                if installed_version() >= (0, 15):
                    # vLLM 0.15.0 appends the parameters the module does have (0.14.1's utils.py lacks
                    # it, 0.15.0's has it); a set, printed in its own order
                    available = {self._get_qualname(base_prefix, name) for name, _ in module.named_parameters(recurse=True)}
                    message += f". The available parameters belonging to {base_prefix} ({type(module).__name__}) are: {available}"
                raise ValueError(message)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return set(self._load_module("", self.module, weights))


# --------------------------------------------------------------------------------------------------
# decoder (shared by Qwen2 and Llama; vLLM has one copy per file)
# --------------------------------------------------------------------------------------------------
def _head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class _SelfAttention(nn.Module):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, dtype: torch.dtype):
        super().__init__()
        hd = _head_dim(config)
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, hd, heads, kv_heads, qkv_bias, dtype)
        self.o_proj = RowParallelLinear(heads * hd, config.hidden_size, o_bias, dtype)
        self.rotary_emb = RotaryEmbedding()
        self.attn = Attention()


class _MLP(nn.Module):
    def __init__(self, config, bias: bool, dtype: torch.dtype):
        super().__init__()
        inter = config.intermediate_size
        self.gate_up_proj = MergedColumnParallelLinear(config.hidden_size, [inter, inter], bias, dtype)
        self.down_proj = RowParallelLinear(inter, config.hidden_size, bias, dtype)
        self.act_fn = SiluAndMul()


class _DecoderLayer(nn.Module):
    def __init__(self, config, qkv_bias: bool, o_bias: bool, mlp_bias: bool, dtype: torch.dtype):
        super().__init__()
        self.self_attn = _SelfAttention(config, qkv_bias, o_bias, dtype)
        self.mlp = _MLP(config, mlp_bias, dtype)
        self.input_layernorm = RMSNorm(config.hidden_size, dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, dtype)


class _DecoderModel(nn.Module):
    qkv_bias = o_bias = mlp_bias = False

    def __init__(self, config, dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, dtype)
        self.layers = nn.ModuleList(
            _DecoderLayer(config, self._qkv_bias(config), self._o_bias(config), self._mlp_bias(config), dtype)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, dtype)

    def _qkv_bias(self, config) -> bool:
        return self.qkv_bias

    def _o_bias(self, config) -> bool:
        return self.o_bias

    def _mlp_bias(self, config) -> bool:
        return self.mlp_bias


class Qwen2Model(_DecoderModel):
    qkv_bias = True

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        stacked_params_mapping = [
            # (param_name, shard_name, shard_id)
            ("qkv_proj", "q_proj", "q"),
            ("qkv_proj", "k_proj", "k"),
            ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0),
            ("gate_up_proj", "up_proj", 1),
        ]
        params_dict = dict(self.named_parameters(remove_duplicate=False))
        loaded_params: set[str] = set()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            for param_name, weight_name, shard_id in stacked_params_mapping:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                # Skip loading extra bias for GPTQ models.
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                # Skip loading extra bias for GPTQ models.
                if name.endswith(".bias") and name not in params_dict:
                    continue
                # Remapping the name of FP8 kv-scale.
                name = maybe_remap_kv_scale_name(name, params_dict)
                if name is None:
                    continue
                # vLLM 0.13.0's Qwen2Model skips a name it lacks here (not accepted, no KeyError; 0.12.0's
                # qwen2.py raises); a q/k/v/gate/up name above still raises, and Llama does throughout
                if name not in params_dict and installed_version() >= (0, 13):
                    continue
                param = params_dict[name]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params


class LlamaModel(_DecoderModel):
    def _qkv_bias(self, config) -> bool:
        return bool(getattr(config, "attention_bias", False))

    def _o_bias(self, config) -> bool:
        return bool(getattr(config, "attention_bias", False))

    def _mlp_bias(self, config) -> bool:
        return bool(getattr(config, "mlp_bias", False))

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        stacked_params_mapping = [
            # (param_name, shard_name, shard_id)
            (".qkv_proj", ".q_proj", "q"),
            (".qkv_proj", ".k_proj", "k"),
            (".qkv_proj", ".v_proj", "v"),
            (".gate_up_proj", ".gate_proj", 0),
            (".gate_up_proj", ".up_proj", 1),
        ]
        params_dict = dict(self.named_parameters())
        loaded_params: set[str] = set()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            if "rotary_emb.cos_cached" in name or "rotary_emb.sin_cached" in name:
                # Models trained using ColossalAI may include these tensors in the checkpoint.
                continue
            if "scale" in name:
                # Remapping the name of FP8 kv-scale.
                name = maybe_remap_kv_scale_name(name, params_dict)
                if name is None:
                    continue
            for param_name, weight_name, shard_id in stacked_params_mapping:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                # Skip loading extra bias for GPTQ models.
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                # Skip loading extra bias for GPTQ models.
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params


# --------------------------------------------------------------------------------------------------
# root classes
# --------------------------------------------------------------------------------------------------
class _ForCausalLM(nn.Module):
    """Common root: builds ``model`` + ``lm_head``, records what ``load_weights`` receives and can
    unpack itself back into a Hugging Face state dict."""

    model_cls: type = _DecoderModel

    def __init__(self, config, dtype: torch.dtype = torch.float32):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.model = self.model_cls(config, dtype)
        if config.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype)
        self.logits_processor = LogitsProcessor()
        self.sampler = Sampler()
        # --- test instrumentation (not in vLLM) ---
        self.received_names: list[list[str]] = []  # one list of incoming names per load_weights call
        self.loaded_names: list[set[str]] = []  # what each successful call returned
        self.weights_version = 0  # bumped by every load_weights call (even one that raised midway)
        self.scrambled_versions: list[int] = []  # weights_version values a level-2 sleep left garbage in
        self._recording = True

    # -- vLLM API -----------------------------------------------------------------------------------
    def _root_load_weights(self, weights):  # pragma: no cover - overridden
        raise NotImplementedError

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        weights = list(weights)  # materialised only to record the names; loading order is unchanged
        if self._recording:
            self.received_names.append([name for name, _ in weights])
        try:
            loaded = self._root_load_weights(weights)
        finally:
            self.weights_version += 1
        if self._recording:
            self.loaded_names.append(loaded)
        return loaded

    # -- test helpers -------------------------------------------------------------------------------
    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights currently held, unpacked into Hugging Face names and shapes (copies)."""
        cfg = self.config
        vocab = cfg.vocab_size
        inter = cfg.intermediate_size
        out: dict[str, torch.Tensor] = {}

        def put(name: str, tensor: torch.Tensor | None) -> None:
            if tensor is not None:
                out[name] = tensor.detach().clone()

        put("model.embed_tokens.weight", self.model.embed_tokens.weight[:vocab])
        for i, layer in enumerate(self.model.layers):
            p = f"model.layers.{i}."
            qkv = layer.self_attn.qkv_proj
            sizes = qkv.output_sizes
            qw, kw, vw = qkv.weight.split(sizes, dim=0)
            qb, kb, vb = qkv.bias.split(sizes, dim=0) if qkv.bias is not None else (None, None, None)
            put(p + "self_attn.q_proj.weight", qw)
            put(p + "self_attn.q_proj.bias", qb)
            put(p + "self_attn.k_proj.weight", kw)
            put(p + "self_attn.k_proj.bias", kb)
            put(p + "self_attn.v_proj.weight", vw)
            put(p + "self_attn.v_proj.bias", vb)
            put(p + "self_attn.o_proj.weight", layer.self_attn.o_proj.weight)
            put(p + "self_attn.o_proj.bias", layer.self_attn.o_proj.bias)
            gate_up = layer.mlp.gate_up_proj
            gw, uw = gate_up.weight.split([inter, inter], dim=0)
            gb, ub = gate_up.bias.split([inter, inter], dim=0) if gate_up.bias is not None else (None, None)
            put(p + "mlp.gate_proj.weight", gw)
            put(p + "mlp.gate_proj.bias", gb)
            put(p + "mlp.up_proj.weight", uw)
            put(p + "mlp.up_proj.bias", ub)
            put(p + "mlp.down_proj.weight", layer.mlp.down_proj.weight)
            put(p + "mlp.down_proj.bias", layer.mlp.down_proj.bias)
            put(p + "input_layernorm.weight", layer.input_layernorm.weight)
            put(p + "post_attention_layernorm.weight", layer.post_attention_layernorm.weight)
        put("model.norm.weight", self.model.norm.weight)
        put("lm_head.weight", self.lm_head.weight[:vocab])
        return out

    def reset_records(self) -> None:
        self.received_names.clear()
        self.loaded_names.clear()


class Qwen2ForCausalLM(_ForCausalLM):
    model_cls = Qwen2Model

    def _root_load_weights(self, weights):
        loader = AutoWeightsLoader(self, skip_prefixes=(["lm_head."] if self.config.tie_word_embeddings else None))
        return loader.load_weights(weights)


class LlamaForCausalLM(_ForCausalLM):
    model_cls = LlamaModel

    # Mistral/Llama format mapping
    mistral_mapping = {
        "layers": "model.layers",
        "attention": "self_attn",
        "wq": "q_proj",
        "wk": "k_proj",
        "wv": "v_proj",
        "wo": "o_proj",
        "attention_norm": "input_layernorm",
        "feed_forward": "mlp",
        "w1": "gate_proj",
        "w2": "down_proj",
        "w3": "up_proj",
        "ffn_norm": "post_attention_layernorm",
        "tok_embeddings": "model.embed_tokens",
        "output": "lm_head",
        "norm": "model.norm",
    }

    def _root_load_weights(self, weights):
        loader = AutoWeightsLoader(self, skip_prefixes=(["lm_head."] if self.config.tie_word_embeddings else None))
        return loader.load_weights(self.maybe_remap_mistral(name, loaded_weight) for name, loaded_weight in weights)

    def maybe_remap_mistral(self, name: str, loaded_weight: torch.Tensor) -> tuple[str, torch.Tensor]:
        def permute(w: torch.Tensor, n_heads: int):
            attn_in = _head_dim(self.config) * n_heads
            attn_out = self.config.hidden_size
            return w.view(n_heads, attn_in // n_heads // 2, 2, attn_out).transpose(1, 2).reshape(attn_in, attn_out)

        mapping = self.mistral_mapping
        modules = name.split(".")
        # rotary embeds should be sliced
        if "wk" in modules:
            loaded_weight = permute(loaded_weight, self.config.num_key_value_heads)
        elif "wq" in modules:
            loaded_weight = permute(loaded_weight, self.config.num_attention_heads)
        for item in modules:
            if item in mapping and mapping[item] not in name:
                name = name.replace(item, mapping[item])
        return name, loaded_weight


ARCHITECTURES = {
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "LlamaForCausalLM": LlamaForCausalLM,
}


def build_model(hf_config, dtype: torch.dtype = torch.float32) -> _ForCausalLM:
    """The stand-in vLLM model for a Hugging Face config (uninitialised weights: zeros)."""
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        model_type = getattr(hf_config, "model_type", "")
        archs = {"qwen2": ["Qwen2ForCausalLM"], "llama": ["LlamaForCausalLM"]}.get(model_type, [model_type])
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch](hf_config, dtype)
    raise ValueError(f"Model architectures {archs} are not supported for now. Supported architectures: {list(ARCHITECTURES)}")
