"""Stand-in for ``vllm.LLM`` (vLLM 0.7.2 offline engine), CPU-only, for tiny local HF checkpoints."""

from __future__ import annotations

import glob
import itertools
import os
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import torch

from ..engine.arg_utils import LOGPROBS_MODES, check_engine_kwargs, installed_version
from ..engine.llm_engine import LLMEngine
from ..logprobs import Logprob
from ..model_executor.models import build_model
from ..outputs import CompletionOutput, RequestOutput
from ..sampling_params import SamplingParams
from ..worker.worker import ModelRunner, Worker

_STR_DTYPES = {
    "half": torch.float16,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float": torch.float32,
    "float32": torch.float32,
}


def resolve_dtype(dtype: str | torch.dtype, config_dtype: Any) -> torch.dtype:
    """vLLM 0.7.2 ``_get_and_verify_dtype`` (GPU path): ``"auto"`` keeps the checkpoint dtype,
    except that float32 checkpoints run in float16."""
    if isinstance(config_dtype, str):
        config_dtype = getattr(torch, config_dtype)
    if config_dtype is None:
        config_dtype = torch.float32
    if isinstance(dtype, torch.dtype):
        return dtype
    dtype = dtype.lower()
    if dtype == "auto":
        return torch.float16 if config_dtype == torch.float32 else config_dtype
    if dtype not in _STR_DTYPES:
        raise ValueError(f"Unknown dtype: {dtype}")
    return _STR_DTYPES[dtype]


def _penalised(sequences: torch.Tensor, logits: Sequence[torch.Tensor], prompt_len: int, penalty: float) -> list:
    """Per generation step, the raw logits with only the repetition penalty applied (over the prompt
    and the tokens generated before that step), as vLLM 0.10.0 / 0.10.1's "processed" log-probs."""
    if penalty == 1.0:
        return list(logits)
    from transformers import RepetitionPenaltyLogitsProcessor

    processor = RepetitionPenaltyLogitsProcessor(penalty)
    return [processor(sequences[:, : prompt_len + step], row.clone()) for step, row in enumerate(logits)]


def _checkpoint_weights(path: str):
    """The checkpoint's tensors in file order (what vLLM's default loader iterates)."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if files:
        from safetensors.torch import load_file

        for f in files:
            yield from load_file(f).items()
        return
    files = sorted(glob.glob(os.path.join(path, "pytorch_model*.bin")))
    if not files:
        raise RuntimeError(f"Cannot find any model weights with `{path}`")
    for f in files:
        yield from torch.load(f, map_location="cpu", weights_only=True).items()


class LLM:
    """Subset of ``vllm.LLM``. Accepts the 0.7.2 constructor arguments; extra engine arguments
    (``device``, ``enable_prefix_caching``, ``max_model_len``, ...) are recorded in
    ``engine_kwargs``. ``model`` must be a local directory holding a Qwen2/Llama checkpoint."""

    def __init__(
        self,
        model: str,
        tokenizer: str | None = None,
        tokenizer_mode: str = "auto",
        skip_tokenizer_init: bool = False,
        trust_remote_code: bool = False,
        allowed_local_media_path: str = "",
        tensor_parallel_size: int = 1,
        dtype: str | torch.dtype = "auto",
        quantization: str | None = None,
        revision: str | None = None,
        tokenizer_revision: str | None = None,
        seed: int = 0,
        gpu_memory_utilization: float = 0.9,
        swap_space: float = 4,
        cpu_offload_gb: float = 0,
        enforce_eager: bool | None = None,
        max_seq_len_to_capture: int = 8192,
        disable_custom_all_reduce: bool = False,
        disable_async_output_proc: bool = False,
        hf_overrides: Any = None,
        mm_processor_kwargs: dict | None = None,
        task: str = "auto",
        override_pooler_config: Any = None,
        compilation_config: Any = None,
        **kwargs: Any,
    ) -> None:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        if not isinstance(model, (str, os.PathLike)) or not os.path.isdir(model):
            raise ValueError(f"vllm stand-in: `model` must be a local checkpoint directory (no Hub access), got {model!r}")
        if tensor_parallel_size != 1:
            raise NotImplementedError("vllm stand-in: tensor_parallel_size must be 1")
        if quantization is not None:
            raise NotImplementedError("vllm stand-in: quantization is not supported")
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"GPU memory utilization must be within (0, 1]. Got {gpu_memory_utilization}.")
        check_engine_kwargs(kwargs)
        # vLLM >= 0.10.0 (check_engine_kwargs refuses the name before): which log-probs
        # SamplingParams(logprobs=k) returns, of the raw logits (default) or of the processed ones
        self.logprobs_mode = kwargs.get("logprobs_mode", "raw_logprobs")
        if self.logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"Invalid logprobs_mode {self.logprobs_mode!r}: expected one of {LOGPROBS_MODES}")

        self.model_path = os.fspath(model)
        self.engine_kwargs = dict(kwargs)
        self.init_kwargs = dict(
            model=self.model_path,
            tokenizer=tokenizer,
            dtype=dtype,
            seed=seed,
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=enforce_eager,
            **kwargs,
        )
        self.device = kwargs.get("device", "auto")
        self.hf_config = AutoConfig.from_pretrained(self.model_path)
        self.dtype = resolve_dtype(dtype, getattr(self.hf_config, "torch_dtype", None))
        max_model_len = kwargs.get("max_model_len")
        self.max_model_len = int(max_model_len or self.hf_config.max_position_embeddings)
        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer or self.model_path)

        # The packed "vLLM" model, loaded from the checkpoint through its own load_weights (as vLLM's
        # DefaultModelLoader does); that initial load is not recorded in received_names.
        packed = build_model(self.hf_config, self.dtype)
        packed._recording = False
        packed.load_weights(_checkpoint_weights(self.model_path))
        packed._recording = True
        packed.eval()

        # The engine TRL reaches into: V0 (model_executor.driver_worker here) or, vLLM >= 0.8's
        # default, V1 (see vllm/engine/arg_utils.py). Generation runs this worker's model either way.
        self._worker = Worker(ModelRunner(packed, lambda: _checkpoint_weights(self.model_path)), device=str(self.device))
        model_config = SimpleNamespace(hf_config=self.hf_config, dtype=self.dtype, max_model_len=self.max_model_len)
        self.llm_engine = LLMEngine.from_engine_args(
            SimpleNamespace(
                worker=self._worker,
                model_config=model_config,
                tokenizer=self.tokenizer,
                distributed_executor_backend=kwargs.get("distributed_executor_backend"),
            )
        )

        # Hugging Face twin used for generation; its weights are refreshed from the packed params.
        with torch.random.fork_rng(devices=[]):
            self._hf_model = AutoModelForCausalLM.from_config(self.hf_config, torch_dtype=self.dtype)
        self._hf_model.eval()
        self._synced_version = -1
        self._seed_gen = torch.Generator().manual_seed(seed)
        self._request_counter = itertools.count()
        self.generate_calls = 0
        self.received_prompt_ids: list[list[list[int]]] = []  # per generate() call: each request's prompt ids
        self.returned_completion_ids: list[list[list[int]]] = []  # per generate() call: every completion's ids
        self.prefix_cache_resets = 0
        # Automatic prefix caching as vLLM 0.7's block manager keeps it: full blocks of prompt
        # tokens, keyed by their content and everything before them, never by the weights that
        # computed them. load_weights() leaves the cache alone; only reset_prefix_cache() empties
        # it. The stand-in does not feed cached KV into generation; it records, per generate(),
        # how many prompt tokens vLLM would have served from the cache ("hit") and how many of
        # those were computed under older weights than the ones loaded now ("stale").
        self.enable_prefix_caching = bool(kwargs.get("enable_prefix_caching", False))
        self.block_size = int(kwargs.get("block_size") or 16)
        # Sleep mode (vLLM's CuMemAllocator): only memory allocated while enable_sleep_mode=True is
        # released by sleep(); without it sleep()/wake_up() leave the weights as they are.
        self.enable_sleep_mode = bool(kwargs.get("enable_sleep_mode", False))
        self.sleeping_tags: set[str] = set()
        # every sleep / wake_up / collective_rpc / generate / chat call, in order, as
        # (name, argument): ("sleep", level), ("wake_up", tags), ("collective_rpc", method name),
        # ("generate", number of prompts), ("chat", number of conversations)
        self.engine_calls: list[tuple] = []
        self.chat_calls = 0
        self.received_chat_prompts: list[list[str]] = []  # per chat() call: each conversation's templated text
        self._cached_blocks: dict[tuple, int] = {}  # prompt prefix ending a block -> weights_version
        self.prefix_cache_log: list[dict] = []

    # -- helpers ------------------------------------------------------------------------------------
    @property
    def model(self):
        """The packed stand-in model (V0: ``llm_engine.model_executor.driver_worker.model_runner.model``)."""
        return self._worker.model_runner.model

    def get_tokenizer(self):
        return self.tokenizer

    def apply_model(self, func):
        return [func(self.model)]

    def reset_prefix_cache(self) -> bool:
        # vLLM refuses (returns False) while requests hold blocks; the offline LLM holds none
        # between generate() calls.
        self.prefix_cache_resets += 1
        self._cached_blocks.clear()
        return True

    def _account_prefix_cache(self, prompt_ids: list) -> None:
        version = self.model.weights_version
        hit = stale = 0
        for ids in prompt_ids:
            reusing = True
            for end in range(self.block_size, len(ids) + 1, self.block_size):
                key = tuple(ids[:end])
                # a block is reused only while every block before it was; the last prompt token
                # is always computed, so a block that ends the prompt is recomputed
                computed_with = self._cached_blocks.get(key) if reusing and end < len(ids) else None
                if computed_with is None:
                    reusing = False
                    self._cached_blocks[key] = version
                    continue
                hit += self.block_size
                stale += self.block_size if computed_with != version else 0
        self.prefix_cache_log.append(dict(weights_version=version, hit_tokens=hit, stale_tokens=stale))

    def _sync_hf_model(self) -> None:
        packed = self.model
        if self._synced_version != packed.weights_version:
            self._hf_model.load_state_dict(packed.hf_state_dict(), strict=True)
            self._synced_version = packed.weights_version

    def _prompt_ids(self, prompt: Any) -> tuple[str | None, list[int]]:
        """vLLM's input preprocessing: a text prompt (``str`` or ``{"prompt": ...}``, i.e.
        ``TextPrompt``) is encoded by the model's tokenizer *with* its special tokens
        (``add_special_tokens=True``: a BOS-adding tokenizer puts a BOS in front, even when the text
        already starts with the BOS text); a token prompt (``{"prompt_token_ids": [...]}``, i.e.
        ``TokensPrompt``) is used as given."""
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer(prompt, add_special_tokens=True).input_ids)
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), [int(i) for i in prompt["prompt_token_ids"]]
            if "prompt" in prompt:
                return prompt["prompt"], list(self.tokenizer(prompt["prompt"], add_special_tokens=True).input_ids)
        raise TypeError(f"vllm stand-in: unsupported prompt type {type(prompt).__name__}")

    def _validate_prompt(self, ids: list) -> None:
        # vLLM's LLMEngine._validate_model_inputs (V0, 0.7 - 0.9; V1's Processor says the same from 0.9)
        if not ids:
            raise ValueError("The decoder prompt cannot be empty")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"The decoder prompt (length {len(ids)}) is longer than the maximum model length of "
                f"{self.max_model_len}. Make sure that `max_model_len` is no smaller than the number of text tokens."
            )

    # -- sleep mode and worker RPCs (vLLM >= 0.10, V1) ------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """``LLM.sleep``: resets the prefix cache, then the executor's sleep. With sleep mode on,
        level 1 offloads the weights to CPU memory (kept) and level 2 discards them: the memory
        ``wake_up`` maps back holds garbage, which the stand-in makes deterministic (every weight
        overwritten from a fixed-seed generator) until the weights are loaded again
        (``collective_rpc("reload_weights")`` or a weight sync). The KV cache is dropped either way."""
        self.engine_calls.append(("sleep", level))
        self.reset_prefix_cache()
        if self.sleeping_tags:  # vLLM's executor: "Executor is already sleeping." (warning, nothing done)
            return
        if self.enable_sleep_mode and level == 2:
            self._scramble_weights()
        self.sleeping_tags = {"weights", "kv_cache"}

    def wake_up(self, tags: list | None = None) -> None:
        """``LLM.wake_up``: ``tags=None`` wakes everything, else only ``"weights"`` / ``"kv_cache"``;
        a tag that is not asleep makes vLLM warn and wake nothing."""
        self.engine_calls.append(("wake_up", None if tags is None else list(tags)))
        if not self.sleeping_tags:
            return
        if tags:
            if any(tag not in self.sleeping_tags for tag in tags):
                return
            self.sleeping_tags -= set(tags)
        else:
            self.sleeping_tags.clear()

    @torch.no_grad()
    def _scramble_weights(self) -> None:
        gen = torch.Generator().manual_seed(1234)
        model = self.model
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=torch.float32).to(param.dtype))
        model.weights_version += 1
        model.scrambled_versions.append(model.weights_version)

    def collective_rpc(self, method: Any, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None) -> list:
        """``LLM.collective_rpc``: runs ``method`` (a worker method's name, or a callable taking the
        worker first) on every worker (one here) and returns their results in a list."""
        self.engine_calls.append(("collective_rpc", method if isinstance(method, str) else getattr(method, "__name__", repr(method))))
        kwargs = kwargs or {}
        if isinstance(method, str):
            return [getattr(self._worker, method)(*args, **kwargs)]
        return [method(self._worker, *args, **kwargs)]

    # -- generation ---------------------------------------------------------------------------------
    def chat(
        self,
        messages: Any,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        lora_request: Any = None,
        chat_template: str | None = None,
        chat_template_content_format: str = "auto",
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list | None = None,
        chat_template_kwargs: dict | None = None,
        mm_processor_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        """``LLM.chat`` (vLLM 0.10 - 0.12, Hugging Face tokenizers): each conversation goes through the
        tokenizer's chat template (``chat_template`` / ``tools`` / ``add_generation_prompt`` /
        ``continue_final_message``, updated by ``chat_template_kwargs``) as text, which is encoded
        with ``add_special_tokens=False`` ("special tokens are already included in chat templates")
        and generated as a token prompt."""
        if mm_processor_kwargs:
            raise NotImplementedError("vllm stand-in: multi-modal chat is not supported")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        self.engine_calls.append(("chat", len(conversations)))
        self.chat_calls += 1
        texts: list[str] = []
        self.received_chat_prompts.append(texts)
        prompts = []
        for conversation in conversations:
            template_kwargs = dict(
                chat_template=chat_template,
                add_generation_prompt=add_generation_prompt,
                continue_final_message=continue_final_message,
                tools=tools,
            )
            template_kwargs.update(chat_template_kwargs or {})
            text = self.tokenizer.apply_chat_template(conversation, tokenize=False, **template_kwargs)
            texts.append(text)
            prompts.append({"prompt_token_ids": self.tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm, lora_request=lora_request, _record=False)

    def generate(
        self,
        prompts: str | dict | Sequence[str | dict] | None = None,
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        prompt_token_ids: list | None = None,
        use_tqdm: bool = True,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        guided_options_request: Any = None,
        priority: list | None = None,
        _record: bool = True,
    ) -> list[RequestOutput]:
        if lora_request is not None or prompt_adapter_request is not None or guided_options_request is not None:
            raise NotImplementedError("vllm stand-in: LoRA / prompt adapters / guided decoding are not supported")
        if prompts is None and prompt_token_ids is not None:
            prompts = [{"prompt_token_ids": ids} for ids in prompt_token_ids]
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts or [])
        if sampling_params is None:
            sampling_params = SamplingParams()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError("The lengths of prompts and sampling_params must be the same.")
        if _record:
            self.engine_calls.append(("generate", len(prompts)))
        self.generate_calls += 1
        if self.sleeping_tags and self.enable_sleep_mode:
            raise RuntimeError(f"vllm stand-in: generate() while the engine sleeps ({sorted(self.sleeping_tags)} not woken up)")
        self._sync_hf_model()
        requests = []
        # recorded before validation, so a test sees what a rejected call carried too
        received: list[list[int]] = []
        self.received_prompt_ids.append(received)
        for prompt, sp in zip(prompts, params_list):
            unsupported = sp.unsupported_fields()
            if unsupported:
                raise NotImplementedError(f"vllm stand-in: SamplingParams fields not supported: {unsupported}")
            text, ids = self._prompt_ids(prompt)
            if sp.truncate_prompt_tokens is not None:
                # "use only the last k tokens from the prompt (i.e., left truncation)"; -1: max_model_len
                keep = self.max_model_len if sp.truncate_prompt_tokens == -1 else sp.truncate_prompt_tokens
                ids = ids[-keep:]
            received.append(ids)
            self._validate_prompt(ids)
            requests.append((text, ids, sp))
        if self.enable_prefix_caching:
            self._account_prefix_cache([ids for _, ids, _ in requests])
        # Requests sharing one SamplingParams object (and no per-request seed) and a prompt length
        # are sampled in one batch (no padding needed); each batch draws its seed from the LLM's RNG.
        batches: dict[Any, list[int]] = {}
        for index, (_, ids, sp) in enumerate(requests):
            key = ("seed", index) if sp.seed is not None else (id(sp), len(ids))
            batches.setdefault(key, []).append(index)
        results: list[RequestOutput | None] = [None] * len(requests)
        for indices in batches.values():
            for index, output in zip(indices, self._generate_batch([requests[i] for i in indices])):
                results[index] = output
        self.returned_completion_ids.append([list(c.token_ids) for r in results for c in r.outputs])  # type: ignore[union-attr]
        return results  # type: ignore[return-value]

    @torch.no_grad()
    def _generate_batch(self, requests: list) -> list[RequestOutput]:
        from transformers import GenerationConfig

        _, first_ids, sp = requests[0]
        prompt_len = len(first_ids)
        max_new = min(sp.max_tokens or self.max_model_len, self.max_model_len - prompt_len)
        eos = self.tokenizer.eos_token_id
        stop_ids = ([] if sp.ignore_eos or eos is None else [eos]) + list(sp.stop_token_ids)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else (eos or 0)
        greedy = sp.temperature < 1e-5
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=max_new,
            min_new_tokens=min(sp.min_tokens, max_new),
            do_sample=not greedy,
            eos_token_id=stop_ids or None,
            pad_token_id=pad,
            repetition_penalty=sp.repetition_penalty,
        )
        if not greedy:
            gen_kwargs.update(
                temperature=sp.temperature,
                top_k=sp.top_k if sp.top_k > 0 else 0,
                top_p=sp.top_p,
                min_p=sp.min_p if sp.min_p > 0 else None,
            )
        else:
            gen_kwargs.update(temperature=None, top_k=None, top_p=None)
        want_logprobs = sp.logprobs is not None
        if want_logprobs:
            gen_kwargs.update(return_dict_in_generate=True, output_scores=True, output_logits=True)
        generation_config = GenerationConfig(**gen_kwargs)
        seed = sp.seed if sp.seed is not None else int(torch.randint(0, 2**62, (1,), generator=self._seed_gen))
        input_ids = torch.tensor([ids for _, ids, _ in requests for _ in range(sp.n)], dtype=torch.long)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            out = self._hf_model.generate(
                input_ids=input_ids,
                attention_mask=torch.ones_like(input_ids),
                generation_config=generation_config,
            )
        if want_logprobs:
            # per step: raw logits (before any processor) and the processed scores sampling used
            # (penalties, temperature, top-k/top-p/min-p masking), each [batch, vocab]
            if self.logprobs_mode.startswith("raw"):
                step_values = out.logits
            elif installed_version() < (0, 10, 2):
                # vLLM 0.10.0 / 0.10.1's V1 sampler takes the "processed" values after the penalties but
                # BEFORE the temperature and top-k / top-p (vllm/v1/sample/sampler.py there); 0.10.2's
                # are those sampling used
                step_values = _penalised(out.sequences, out.logits, prompt_len, sp.repetition_penalty)
            else:
                step_values = out.scores
            if self.logprobs_mode.endswith("logprobs"):
                step_values = [torch.log_softmax(v.float(), dim=-1) for v in step_values]
            else:
                step_values = [v.float() for v in step_values]
            out = out.sequences
        rows = out[:, prompt_len:].tolist()
        results = []
        for r, (text, ids, _) in enumerate(requests):
            completions = []
            for index, row in enumerate(rows[r * sp.n : (r + 1) * sp.n]):
                token_ids, finish_reason, stop_reason = row, "length", None
                for pos, tok in enumerate(row):
                    if tok in stop_ids and pos + 1 >= sp.min_tokens:
                        token_ids, finish_reason = row[: pos + 1], "stop"
                        stop_reason = None if tok == eos and not sp.ignore_eos else tok
                        break
                logprobs = cumulative = None
                if want_logprobs:
                    logprobs = self._token_logprobs([v[r * sp.n + index] for v in step_values], token_ids, sp.logprobs)
                    cumulative = float(sum(next(iter(lp.values())).logprob for lp in logprobs))
                completions.append(
                    CompletionOutput(
                        index=index,
                        text=self.tokenizer.decode(token_ids, skip_special_tokens=sp.skip_special_tokens),
                        token_ids=list(token_ids),
                        cumulative_logprob=cumulative,
                        logprobs=logprobs,
                        finish_reason=finish_reason,
                        stop_reason=stop_reason,
                    )
                )
            results.append(
                RequestOutput(
                    request_id=str(next(self._request_counter)),
                    prompt=text,
                    prompt_token_ids=ids,
                    prompt_logprobs=None,
                    outputs=completions,
                    finished=True,
                )
            )
        return results

    def _token_logprobs(self, values: list, token_ids: list, k: int) -> list[dict]:
        """vLLM's sample logprobs: per generated token a dict, the sampled token first, then the top
        ``k`` (the sampled one is not repeated), each a ``Logprob`` with its rank."""
        result = []
        for step, token in enumerate(token_ids):
            row = values[step]
            chosen = row[token]
            entries = {int(token): Logprob(float(chosen), int((row > chosen).sum()) + 1, self.tokenizer.decode([token]))}
            if k:
                top = torch.topk(row, k)
                for rank, (value, tid) in enumerate(zip(top.values.tolist(), top.indices.tolist()), start=1):
                    entries.setdefault(int(tid), Logprob(float(value), rank, self.tokenizer.decode([tid])))
            result.append(entries)
        return result
