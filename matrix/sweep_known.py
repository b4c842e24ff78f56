"""The sweep's KNOWN table: for each patch id, the TRL releases and installed versions where research
found its bug, kept independent of the patches' own windows on purpose (a patch that applies outside
its KNOWN window is a wrong application in SWEEP.md)."""

from packaging.version import Version

V = Version


def _v(versions, dist):
    raw = versions.get(dist)
    return V(raw) if raw else None


def _fixed_in(v, release, main_line):
    """Before the release that shipped a fix, or a main-branch build of the line it landed in
    (a fix cherry-picked into a patch release lands on main one line later: 0.27.1 and 0.28.0.dev0)."""
    return v < V(release) or (v.is_devrelease and v < V(main_line))


KNOWN = {
    # bug present (per research/trl-bugs.md and issue 8) for these releases and installed versions
    "peft-optional": lambda v, vs: _v(vs, "peft") is None and v < V("0.16.0"),
    # the four vLLM-sync patches also require vllm installed (nothing to sync without it)
    "vllm-lora-names": lambda v, vs: _v(vs, "vllm") is not None and v == V("0.14.0"),
    "vllm-merged-weights": lambda v, vs: _v(vs, "vllm") is not None and v == V("0.15.0"),
    "logits-to-keep": lambda v, vs: V("0.14.0") <= v < V("0.20.0"),
    "zero3-unwrap": lambda v, vs: V("0.14.0") <= v < V("0.16.0"),
    "zero3-hooks-api": lambda v, vs: V("0.14.0") <= v < V("0.16.0") and (_v(vs, "deepspeed") or V("0")) >= V("0.16.4"),
    "train-sampler-signature": lambda v, vs: V("0.15.0") <= v < V("0.17.0") and _v(vs, "transformers") >= V("4.52.0"),
    "grpo-eval-0.14": lambda v, vs: v == V("0.14.0"),
    "vllm-prefix-cache": lambda v, vs: _v(vs, "vllm") is not None and V("0.15.0") <= v < V("0.16.0"),
    # research/further-bugs.md S1-S3 (issue 13); GRPO's use_vllm needs vllm installed
    "vllm-prompt-truncation": lambda v, vs: _v(vs, "vllm") is not None and V("0.14.0") <= v < V("0.19.0"),
    "vllm-prompt-special-tokens": lambda v, vs: _v(vs, "vllm") is not None and v == V("0.19.0"),
    "vllm-double-bos": lambda v, vs: _v(vs, "vllm") is not None and V("0.14.0") <= v < V("0.24.0"),
    # issue 13: FSDP1-only sync (PR #3687); in-process sync vs vLLM's V1 default (0.8) until V0's removal (0.11)
    # and, from PR #3687 (0.20.0), the FSDP2 sync's PEFT names until PR #4603 (0.26.0)
    "fsdp2-vllm-sync": lambda v, vs: _v(vs, "vllm") is not None and V("0.18.0") <= v < V("0.26.0"),
    "vllm-v1-engine": lambda v, vs: V("0.14.0") <= v < V("0.16.0") and V("0.8.0") <= (_v(vs, "vllm") or V("0")) < V("0.11.0"),
    # research/further-bugs.md S4, S5, C1, C3, C4, C5, C8 (issue 14)
    "logps-attention-mask": lambda v, vs: v == V("0.14.0"),
    "logps-temperature": lambda v, vs: V("0.14.0") <= v < V("0.16.0"),
    "peft-gradient-checkpointing": lambda v, vs: _v(vs, "peft") is not None and V("0.14.0") <= v < V("0.16.0"),
    "pad-token": lambda v, vs: V("0.14.0") <= v < V("0.17.0"),
    "dataloader-workers": lambda v, vs: V("0.14.0") <= v < V("0.18.2"),
    "reward-model-zero3": lambda v, vs: _v(vs, "deepspeed") is not None and V("0.14.0") <= v < V("0.17.0"),
    "resume-buffered-inputs": lambda v, vs: V("0.16.0") <= v < V("0.17.0"),
    # transformers 5: the tuple-valued _*_available flags until PR #5129 (0.29.0); use_cache=None until
    # TRL 0.20's model loading rewrite (PR #3072); model.warnings_issued[...] until PR #4960 (0.28.0)
    "transformers5-import": lambda v, vs: V("0.14.0") <= v < V("0.29.0") and _v(vs, "transformers") >= V("5.0.0"),
    "transformers5-use-cache": lambda v, vs: V("0.14.0") <= v < V("0.20.0") and _v(vs, "transformers") >= V("5.0.0"),
    "transformers5-warnings-issued": lambda v, vs: V("0.14.0") <= v < V("0.28.0") and _v(vs, "transformers") >= V("5.0.0"),
    # research/bugs-0.20-plus.md (issues 22 and 23): TRL 0.20 - 0.29.1
    "generation-config-model-defaults": lambda v, vs: (
        _fixed_in(v, "0.26.2", "0.27.0") and V("4.50.0") <= _v(vs, "transformers") < V("5.0.0")
    ),
    "vllm-is-raw-logprobs": lambda v, vs: _v(vs, "vllm") is not None and V("0.23.0") <= v < V("0.24.0"),
    # open upstream (TRL #6789): no release fixes it; vLLM >= 0.10.2's processed log-probs are after top-k/top-p
    "vllm-is-truncated-support": lambda v, vs: (_v(vs, "vllm") or V("0")) >= V("0.10.2") and v >= V("0.24.0"),
    # open upstream (TRL #6622): every FSDP2 sync since 0.20.0 calls full_tensor() on ignored (plain) parameters
    "fsdp2-ignored-params-sync": lambda v, vs: _v(vs, "vllm") is not None and v >= V("0.20.0"),
    # not reported upstream: 1.11's packed server sync reads the LoRA walk's views after the in-place unmerge
    "vllm-packed-lora-sync": lambda v, vs: _v(vs, "vllm") is not None and _v(vs, "peft") is not None and v >= V("1.11.0"),
    # open upstream (TRL #6688): the LoRA walk merges and unmerges in place; covered from 1.11's walk on
    "vllm-lora-merge-drift": lambda v, vs: _v(vs, "vllm") is not None and _v(vs, "peft") is not None and v >= V("1.11.0"),
    # open upstream (TRL #6586): use_bias_correction_kl (PR #4638, 0.26.0) multiplies the KL by the sequence ratio
    "kl-bias-correction-sequence": lambda v, vs: v >= V("0.26.0"),
    # fixed in 1.10.0 (PR #5313's _llm_weights_sleeping)
    "vllm-sleep-mode-weights": lambda v, vs: _v(vs, "vllm") is not None and v >= V("0.25.0") and _fixed_in(v, "1.10.0", "1.10.0"),
    "scale-rewards-swapped": lambda v, vs: V("0.22.0") <= v and _fixed_in(v, "0.22.2", "0.23.0"),
    "prompt-right-truncation": lambda v, vs: V("0.24.0") <= v < V("0.26.0"),
    "tool-loop-retokenization": lambda v, vs: V("0.26.0") <= v and _fixed_in(v, "0.29.1", "1.0.0"),
    "vllm-guided-decoding-import": lambda v, vs: V("0.16.0") <= v < V("0.27.0") and (_v(vs, "vllm") or V("0")) >= V("0.12.0"),
    # 0.28.0 brought `tools or []` back (trl/generation/); 0.29.0's VLLMClient.chat takes tools
    "tools-empty-list-server": lambda v, vs: V("0.26.0") <= v and _fixed_in(v, "0.26.1", "0.27.0") or V("0.28.0") <= v < V("0.29.0"),
    "eval-before-train-ga": lambda v, vs: V("0.22.0") <= v and _fixed_in(v, "0.27.1", "0.28.0"),
    "vllm-serve-get-open-port": lambda v, vs: V("0.17.0") <= v < V("0.28.0") and (_v(vs, "vllm") or V("0")) >= V("0.14.0"),
    "entropy-mask-gather-hang": lambda v, vs: V("0.21.0") <= v and _fixed_in(v, "0.23.1", "0.24.0"),
    "qlora-peftmodel-frozen": lambda v, vs: V("0.22.0") <= v and _fixed_in(v, "0.23.1", "0.24.0"),
    "qlora-config-rebuild": lambda v, vs: _v(vs, "peft") is not None and V("0.22.0") <= v < V("0.23.0"),
    # PR #4577's bf16 cast of a 4/8-bit model's adapters (0.26.0) until issue #7268's fix (1.15.0); earlier: no cast
    "dora-magnitude-bf16": lambda v, vs: _v(vs, "peft") is not None and V("0.26.0") <= v < V("1.15.0"),
    # DeepSpeed 0.19.2 only (0.19.3 fixed it); TRL 1.7 fixed its peft_config path, a PeftModel passed in: every TRL
    "zero3-peft-mixed-dtype": lambda v, vs: (
        _v(vs, "peft") is not None and V("0.19.2") <= (_v(vs, "deepspeed") or V("0")) < V("0.19.3")
    ),
    "tools-colocate-llm-attr": lambda v, vs: V("0.28.0") <= v and _fixed_in(v, "0.29.1", "1.0.0"),
    # research/bugs-1x.md C9: reward_funcs[i].__name__ until PR #6313 (1.9.0)
    "reward-func-partial-name": lambda v, vs: V("0.14.0") <= v < V("1.9.0"),
    "vllm-weight-transfer-0.28": lambda v, vs: V("1.11.0") <= v < V("1.13.0") and (_v(vs, "vllm") or V("0")) >= V("0.28.0"),
    # research/bugs-1x.md S2, S3 (PR #6024 in the 1.9.1 wheel; PR #6439, 1.9.0), C2 (PR #6356, 1.9.0), S5 (PR #5380),
    # S6 (PR #5330): both 1.0.0; tools on 0.29.1 need transformers 5
    "dapo-generation-batch-normalizer": lambda v, vs: V("0.22.0") <= v < V("1.9.1"),
    "dapo-masked-token-normalizer": lambda v, vs: V("0.22.0") <= v < V("1.9.0"),
    "peft-zero3-gc-reentrant": lambda v, vs: (
        _v(vs, "peft") is not None and _v(vs, "deepspeed") is not None and V("0.27.0") <= v < V("1.9.0")
    ),
    # research/bugs-1x.md C5 (PR #4693, 1.5.0); DeepSpeed 0.19.2 (PR #8043) invalidates the trace itself
    "zero3-hooks-trace": lambda v, vs: (
        _v(vs, "deepspeed") is not None and _v(vs, "deepspeed") < V("0.19.2") and V("0.14.0") <= v < V("1.5.0")
    ),
    "tools-empty-list-template": lambda v, vs: v == V("0.26.0") or V("0.28.0") <= v < V("1.0.0"),
    "tool-suffix-eos-newline": lambda v, vs: v == V("0.29.1") and _v(vs, "transformers") >= V("5.0.0"),
    # ledger record 1.14.1..1.14.2 (wheel diff); TRL < 0.24 computes the mask inline, where the patch does not reach
    "generation-eos-ids": lambda v, vs: V("0.24.0") <= v < V("1.14.2"),
    # research/bugs-1x.md S4 (PR #5902, 1.6.0); 0.16 - 0.18 score rewards inline, where the patch does not reach
    "none-reward-baseline": lambda v, vs: V("0.19.0") <= v < V("1.6.0"),
    # PR #6423 (c24964d0a, 1.9.0); the setting arrived in 0.27.0
    "tool-iterations-zero": lambda v, vs: V("0.27.0") <= v < V("1.9.0"),
    # PR #6364 (66d9b8da7, 1.9.0); environment_factory arrived in 0.29.0 with the in-place loop
    "environment-prompt-mutation": lambda v, vs: V("0.29.0") <= v < V("1.9.0"),
    # PR #3725 (508d551db, 0.20.0); steps_per_generation arrived in 0.18.0
    "misaligned-generation-old-logps": lambda v, vs: V("0.18.0") <= v < V("0.20.0"),
    # PR #3723 (640a9f391, 0.20.0) brought the 12345 fallback, PR #4057 (008c7ad9a, 0.24.0) fixed it
    "colocate-master-port": lambda v, vs: V("0.20.0") <= v < V("0.24.0"),
    # PR #4682: 2f62f3d03 (0.26.1) and 8bc520d36 (main 0.27.0.dev0); the setting came with 0.26.0
    "num-generations-eval-check": lambda v, vs: V("0.26.0") <= v and _fixed_in(v, "0.26.1", "0.27.0"),
    # PR #3634 (84982ad79; cherry-picked for 0.19.1)
    "colocate-generation-kwargs": lambda v, vs: v == V("0.19.0"),
    # ledger record 1.14.0..1.14.1 (wheel diff); the tool loop refused server mode before PR #5235 (c0e3fb0c5, 1.0.0)
    "tool-loop-server-generations": lambda v, vs: V("1.0.0") <= v < V("1.14.1"),
    # PR #5811 (4711a21d6, 1.5.0); GRPO evaluates from 0.15.0 (PR #2694, prediction_step and the eval_ prefix)
    "metric-for-best-model": lambda v, vs: V("0.15.0") <= v < V("1.5.0"),
    # ledger record 1.9.2..1.10.0 (wheel diff; PR #6654); luspo came with PR #4988 (ff55949cc, 0.28.0)
    "luspo-unmasked-loss": lambda v, vs: V("0.28.0") <= v < V("1.10.0"),
    # PR #3388 (cf5183db7, 0.18.0) brought the check, PR #3658 (9155c8fbb; cherry-picked as 6a6d4345c for 0.19.1) fixed it
    "generation-batch-size-check": lambda v, vs: V("0.18.0") <= v < V("0.19.1"),
    # ledger record 1.9.2..1.10.0#2 (wheel diff); entropy_coef came with PR #6140 (34c7f0d85, 1.8.0)
    "entropy-coef-normalizer": lambda v, vs: V("1.8.0") <= v < V("1.10.0"),
    # PR #4845 (c6e3d2696, 0.28.0) imports requests.adapters and urllib3 at the top of trl/generation/vllm_client.py;
    # ledger record 1.14.1..1.14.2 (wheel diff): 1.14.2 imports them only where requests is installed
    "requests-optional": lambda v, vs: _v(vs, "requests") is None and V("0.28.0") <= v < V("1.14.2"),
    # ledger record 1.15.0..1.16.0#3 (wheel diff); the reference reloaded for every non-PEFT run since PR #3575 (0.19.0),
    # through create_model_from_path (the call the patch corrects) since PR #4577 (2af35fb0d, 0.26.0)
    "ref-model-like-policy": lambda v, vs: V("0.26.0") <= v < V("1.16.0"),
    # ledger 7eaaf64a5 (PR #6330, 1.9.0); cast_lm_head_to_fp32 came with PR #4303 (41c8ca1ad, 0.25.0)
    "lm-head-fp32-sharded": lambda v, vs: V("0.25.0") <= v < V("1.9.0"),
    # ledger 0591272af (PR #6043, 1.7.0); the "ref" adapter came with PR #4723 (42cce51cf, 0.27.0), peft refuses a
    # second target_parameters LoRA adapter from PR #2710 (0.17.1) to PR #3350 (0.20.0)
    "peft-target-parameters-ref-adapter": lambda v, vs: (
        V("0.27.0") <= v < V("1.7.0") and V("0.17.1") <= (_v(vs, "peft") or V("0")) < V("0.20.0")
    ),
    # ledger record 1.9.2..1.10.0#3 (wheel diff): PR #6043's skip of the "ref" copy, also where peft >= 0.20 accepts it
    "peft-target-parameters-ref-copy": lambda v, vs: V("1.7.0") <= v < V("1.10.0") and (_v(vs, "peft") or V("0")) >= V("0.20.0"),
    "vlm-ddp-find-unused": lambda v, vs: V("0.20.0") <= v < V("1.16.0"),
    # ledger f19fda4c0 (PR #5458, 1.1.0); the three-conversation prefix check came with 0.29.1
    "tools-template-prefix-check": lambda v, vs: V("0.29.1") <= v < V("1.1.0"),
    # ledger f9df7ba45 (PR #5212, 0.29.1: the tool role) and 0cb9667f3, d4caab865 (PRs #5440, #5496, 1.1.0: tool and
    # empty strings wrapped); tool calling came with PR #4300 (0.26.0)
    "vlm-tool-messages": lambda v, vs: V("0.26.0") <= v < V("1.1.0"),
    # ledger e2eaa2334 (PR #3936, 0.22.0); the None-reward warning that indexes every reward kwarg came with 0.20.0
    "none-reward-warning-state": lambda v, vs: V("0.20.0") <= v < V("0.22.0"),
    # ledger 37ad7c2e7 (PR #4662, 0.27.0); num_generations_eval came with 0.26.0
    "eval-one-generation-nan": lambda v, vs: V("0.26.0") <= v < V("0.27.0"),
    # wheel diffs 1.14.2..1.15.0 (the Triton-only fused LM head) and 1.15.0..1.16.0 (the torch fallback); the sweep
    # runs on the CPU, where Triton cannot run
    "fused-lm-head-no-triton": lambda v, vs: v == V("1.15.0") or (v.is_devrelease and V("1.15.0.dev0") <= v < V("1.16.0.dev0")),
    # wheel diff 1.14.0..1.14.1: vLLM's own server (1.11.0) answers /reset_prefix_cache without a body below vLLM 0.26
    "vllm-server-reset-prefix-cache": lambda v, vs: _v(vs, "vllm") is not None and V("1.11.0") <= v < V("1.14.1"),
    # wheel diff 1.15.0..1.16.0#4: the server's --logprobs-mode, the user's choice from 1.11.0 (vLLM's own server)
    "server-logprobs-mode-check": lambda v, vs: _v(vs, "vllm") is not None and V("1.11.0") <= v < V("1.16.0"),
    # ledger 0b2cd5c04 (PR #5176, 0.29.0), 1919c00d3 / b2b3045df (PR #5178, 0.29.1); the processor's output handed on
    # as **forward_kwargs came with PR #4114 (9603b41d7, 0.24.0); transformers 5's processors return mm_token_type_ids
    "vlm-mm-token-type-ids": lambda v, vs: (
        V("0.24.0") <= v and _fixed_in(v, "0.29.1", "1.0.0") and _v(vs, "transformers") >= V("5.0.0")
    ),
}
