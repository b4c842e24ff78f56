"""The main-branch TRL builds the sweep checks with ``--trl-git``: ``COMMITS`` (each dev build around a
window's bound, with what research found in its code) and, for the 0.21 - 0.28 builds, ``BUG_SPANS``
(the commits that brought and fixed each bug), read against TRL's git history by ``expected_at``."""

import subprocess

# Main-branch commits (reporting X.dev0) around the windows' bounds, with what research found in their
# code (which fix commits each one contains, read with `git merge-base --is-ancestor`): patch id -> whether
# its bug is there, so it must apply. All of these builds (<= 0.20.0.dev0) use the tf4.53 base: peft 0.16.0,
# deepspeed 0.16.4, transformers 4.53.3 and no vLLM, so peft-gradient-checkpointing and reward-model-zero3
# are judged, while the vllm-gated patches (vllm-prompt-truncation, vllm-prompt-special-tokens,
# vllm-double-bos, vllm-v1-engine) are "not needed" by their gate and listed nowhere. Each entry lists the
# patches whose window holds its dev version, so a probe that misses the bug shows too; logps-temperature
# is opt-in and off in the sweep: "disabled" counts as applying (see judge()). The main-branch commit of a
# PR is used, not its cherry-pick on a release branch (#3568: 1a6717661 on v0.18-release; #3651:
# 7dbf4777b on v0.19-release) nor the PR branch's own copy (#3290: 72dfae89b, the commit pad_token.py names,
# is on no branch of TRL's history; main's is 1faa7f9b3).
_EARLY_015 = {
    "logps-attention-mask": True,
    "logps-temperature": True,
    "peft-gradient-checkpointing": True,
    "pad-token": True,
    "reward-model-zero3": True,
    "dataloader-workers": True,
}
_LATE_015 = {**_EARLY_015, "logps-attention-mask": False}
_016 = {
    "logps-temperature": True,
    "peft-gradient-checkpointing": True,
    "pad-token": True,
    "reward-model-zero3": True,
    "resume-buffered-inputs": False,
    "dataloader-workers": True,
}
_016_GC = {**_016, "peft-gradient-checkpointing": False}  # after PR #2848
_016_BUF = {**_016_GC, "resume-buffered-inputs": True}  # after PR #2899
_016_TEMP = {**_016_BUF, "logps-temperature": False}  # after PR #3029
_017 = {"pad-token": True, "reward-model-zero3": True, "resume-buffered-inputs": True, "dataloader-workers": True}
COMMITS = [
    ("ab30a01ba", "0.15.0.dev0 before PR #2694 (grpo-eval-0.14 fix)", {**_EARLY_015, "grpo-eval-0.14": True, "vllm-lora-names": True}),
    ("fecaa991d", "PR #2694: prediction_step added", {**_EARLY_015, "grpo-eval-0.14": False, "vllm-lora-names": True}),
    (
        "6e088d165",
        "0.15.0.dev0 before PR #2708 (attention-mask fix): model(input_ids, logits_to_keep=...), no mask",
        {**_EARLY_015, "logps-attention-mask": True, "vllm-lora-names": True},
    ),
    (
        "bbdd6db17",
        "PR #2708: the log-prob forwards get attention_mask",
        {**_LATE_015, "logps-attention-mask": False, "vllm-lora-names": True},
    ),
    (
        "7347c292c",
        "0.15.0.dev0 before PR #2725 (PEFT names fix)",
        {**_LATE_015, "vllm-lora-names": True, "vllm-merged-weights": False},
    ),
    (
        "81221661c",
        "PR #2725: PEFT names stripped, unmerge before load",
        {**_LATE_015, "vllm-lora-names": False, "vllm-merged-weights": True},
    ),
    (
        "ffcb9f4ae",
        "0.16.0.dev0 version bump (no num_iterations buffer yet: resume-buffered-inputs' window, no bug)",
        {**_016, "vllm-prefix-cache": True, "vllm-merged-weights": True},
    ),
    ("ba036576d", "0.16.0.dev0 before PR #2873 (merged-weights fix)", {**_016, "vllm-merged-weights": True}),
    ("822653824", "PR #2873: unmerge after load", {**_016, "vllm-merged-weights": False, "vllm-prefix-cache": True}),
    (
        "15fec312d",
        "0.16.0.dev0 before PR #2848 (gradient checkpointing): no enable_input_require_grads",
        {**_016, "peft-gradient-checkpointing": True},
    ),
    ("9b3c5bf64", "PR #2848: _enable_gradient_checkpointing", {**_016_GC, "peft-gradient-checkpointing": False}),
    (
        "a92e00e81",
        "0.16.0.dev0 before PR #2899 (num_iterations, which brought the resume bug): no buffer",
        {**_016_GC, "resume-buffered-inputs": False},
    ),
    ("e5ae703d3", "PR #2899: _buffered_inputs reused without a None check", {**_016_BUF, "resume-buffered-inputs": True}),
    ("ad6a35bdd", "PR #2871: unwraps model_wrapped", {**_016_BUF, "zero3-unwrap": False}),
    (
        "e3244d2d0",
        "0.16.0.dev0 before PR #3029 (temperature fix): log-probs at temperature 1",
        {**_016_BUF, "logps-temperature": True},
    ),
    ("04f659737", "PR #3029: logits divided by the temperature", {**_016_TEMP, "logps-temperature": False}),
    ("a34987956", "0.16.0.dev0 before PR #3094 (prefix-cache reset)", {**_016_TEMP, "vllm-prefix-cache": True}),
    ("f713f614e", "PR #3094: vLLM server, cache reset after each sync", {**_016_TEMP, "vllm-prefix-cache": False}),
    ("2594cb39d", "0.17.0.dev0 before PR #3148 (resume fix)", {**_017, "resume-buffered-inputs": True}),
    ("488025cd8", "PR #3148: generates when the buffered slot is None", {**_017, "resume-buffered-inputs": False}),
    ("66e6eab9b", "0.17.0.dev0 before PR #3290 (pad-token fix)", {**_017, "pad-token": True, "resume-buffered-inputs": False}),
    ("1faa7f9b3", "PR #3290 (main's commit): pad_token = eos_token", {**_017, "pad-token": False, "resume-buffered-inputs": False}),
    (
        "f3e8c2304",
        "0.17.0.dev0 before PR #3326 (reward model under ZeRO-3)",
        {**_017, "reward-model-zero3": True, "resume-buffered-inputs": False, "pad-token": False},
    ),
    (
        "89556c8cb",
        "PR #3326: reward models prepared with prepare_deepspeed",
        {"reward-model-zero3": False, "resume-buffered-inputs": False, "pad-token": False, "dataloader-workers": True},
    ),
    (
        "280d35301",
        "0.18.0.dev0 before PR #3394 (colocate mode, which brought the FSDP1-only sync)",
        {"fsdp2-vllm-sync": False, "dataloader-workers": True},
    ),
    ("18596cf23", "PR #3394: _sync_fsdp_params_to_vllm, FSDP1 modules only", {"fsdp2-vllm-sync": True, "dataloader-workers": True}),
    (
        "3d077fd3d",
        "0.19.0.dev0 before PR #3568 (dataloader workers): bare seed_worker, local collator",
        {"dataloader-workers": True, "fsdp2-vllm-sync": True},
    ),
    (
        "15ff54790",
        "PR #3568 (main's commit): partial(seed_worker, ...), module-level identity",
        {"dataloader-workers": False, "fsdp2-vllm-sync": True},
    ),
    # PR #3601's pair: its patch (vllm-prompt-truncation) needs vLLM, absent here; checks the others in window.
    (
        "8bad863ff",
        "0.19.0.dev0 before PR #3601: the whole prompt to vLLM (the base has the vLLM stand-in)",
        {"dataloader-workers": False, "fsdp2-vllm-sync": True, "logits-to-keep": True, "vllm-prompt-truncation": True},
    ),
    (
        "b0958c6f8",
        "PR #3601: truncated ids re-decoded for vLLM",
        {"dataloader-workers": False, "fsdp2-vllm-sync": True, "logits-to-keep": True, "vllm-prompt-truncation": False},
    ),
    # the base has the vLLM stand-in: the 0.20.0.dev0 builds before PR #3651's main commit still strip the
    # special tokens (0.19.0's bug)
    (
        "32df09358",
        "0.20.0.dev0 with 0.19's code, before PR #3563",
        {"logits-to-keep": True, "fsdp2-vllm-sync": True, "vllm-prompt-special-tokens": True},
    ),
    (
        "7e8ef867a",
        "PR #3563: _get_per_token_logps_and_entropies (also the parent of PR #3651's main commit)",
        {"logits-to-keep": False, "fsdp2-vllm-sync": True, "vllm-prompt-special-tokens": True},
    ),
    (
        "79ec242ae",
        "PR #3651 on main (0.19.1's 7dbf4777b): special tokens kept",
        {"fsdp2-vllm-sync": True, "logits-to-keep": False, "vllm-prompt-special-tokens": False},
    ),
    ("303d3b1d6", "0.20.0.dev0 before PR #3687 (FSDP2 sync)", {"fsdp2-vllm-sync": True}),
    # its own FSDP2 sync sends PEFT names until PR #4603 (0.26.0): fsdp2-vllm-sync's second variant
    ("5522cc0a3", "PR #3687: _sync_fsdp2_params_to_vllm (PEFT names)", {"fsdp2-vllm-sync": True}),
]

# TRL 0.21 - 0.28 main-branch builds around the fixes of issues 22 and 23 (tf4.57 base, vLLM stand-in 0.10.2).
# What each build must say is not written per build: it is read from TRL's git history when the build is
# made (expected_at()): a patch's bug is in a build's code when the build contains the commit that brought
# it (None: older than every build here) and not the commit that fixed it (None: not fixed on main).
BUG_SPANS = {
    "generation-config-model-defaults": (None, "8918c9836"),
    "scale-rewards-swapped": ("fe44806b6", "35702ce37"),
    "entropy-mask-gather-hang": ("5d914a412", "f4ff24840"),
    "qlora-peftmodel-frozen": ("65d7894b6", "7e2075347"),
    "qlora-config-rebuild": ("65d7894b6", "4c47b3281"),
    "eval-before-train-ga": ("2324245ca", "7c4b6f169"),
    "prompt-right-truncation": ("0e57b4a9d", "ca21dd94c"),
    "vllm-double-bos": (None, "cc578b6b1"),
    "vllm-is-raw-logprobs": ("12fc85fd1", "e086f073c"),
    "vllm-is-truncated-support": ("e086f073c", None),
    "fsdp2-vllm-sync": (None, "3979cccad"),
    "tools-empty-list-server": ("ca21dd94c", "26f989efa"),
    "num-generations-eval-check": ("db4f6e5aa", "8bc520d36"),
    "vllm-sleep-mode-weights": ("712f6a9c4", None),
}
COMMITS_0_2X = [
    ("67763762b", "0.21.0.dev0: Add 'Post training a VLM for reasoning with GRPO using T"),
    ("5d914a412", "0.21.0.dev0: [GRPO]: Fix Entropy Mask Threshold Calculation when usin"),
    ("72d4d82b8", "0.22.0.dev0: Add dataset mixer (#3791)"),
    ("65d7894b6", "0.22.0.dev0: Integrate PEFT model preparation across trainers and uti"),
    ("251c0488c", "0.22.0.dev0: Wrapping the main execution code to avoid multi-processi"),
    ("fe44806b6", "0.22.0.dev0: [GRPO] PPO Lite: Scale rewards by Std of Batch (#3935)"),
    ("2324245ca", "0.22.0.dev0: DAPO loss type (#3938)"),
    ("92046bb97", "0.23.0.dev0: Fix GRPO CLI by setting parameters for `get_soft_overlon"),
    ("4c47b3281", "0.23.0.dev0: `args.gradient_checkpointing = False` instead of `args ="),
    ("705306d78", "0.23.0.dev0: Add Trackio integration documentation and update TOC (#3"),
    ("35702ce37", "0.23.0.dev0: Fix scale_rewards issue in GRPO (#3992)"),
    ("fdd6bda11", "0.23.0.dev0: Add pre-commit and hf-doc-builder as dev dependencies (#"),
    ("12fc85fd1", "0.23.0.dev0: [GRPO] Truncated Importance Sampling to address rollout-"),
    ("b8eb5c5d2", "0.24.0.dev0: Improve docstring of AlignPropTrainer (#4059)"),
    ("f4ff24840", "0.24.0.dev0: [GRPO] Fix potential hang in `get_high_entropy_mask` (#4"),
    ("20cc58d77", "0.24.0.dev0: Enable XPU for vLLM client (#4031)"),
    ("7e2075347", "0.24.0.dev0: Fix get_peft_model() so that prepare_model_for_kbit_trai"),
    ("e5d437ed7", "0.24.0.dev0: Hotfix wrong formatting of docstrings with blockquote ti"),
    ("e086f073c", "0.24.0.dev0: Have vLLM return processed (temperature scaled) log prob"),
    ("30cf68a97", "0.24.0.dev0: Support mixing image+text and text-only examples (#4203)"),
    ("cc578b6b1", "0.24.0.dev0: [2/N] Refactor `_generate` in GRPO/RLOO: Use `prompt_ids"),
    ("98488e094", "0.24.0.dev0: Fix CI slow test ValueError: Unknown loss type: dapo (#4"),
    ("0e57b4a9d", "0.24.0.dev0: [3/N] Refactor `_generate` in GRPO/RLOO: Rely on generat"),
    ("1382e564b", "0.25.0.dev0: [5/N] Refactor `_generate` in GRPO/RLOO: Insert images i"),
    ("712f6a9c4", "0.25.0.dev0: Switch to sleep level=2 and split wake-ups in GRPO and R"),
    ("23da61d58", "0.26.0.dev0: fix(PPO examples): passing model dict to models (#4630)"),
    ("3979cccad", "0.26.0.dev0: Fix FSDP2 model key miss match when sync LoRA model to v"),
    ("fda5a7fcd", "0.26.0.dev0: Move KTO to trl.experimental (#4575)"),
    ("ca21dd94c", "0.26.0.dev0: GRPO: Agent training (#4300)"),
    ("37ad7c2e7", "0.27.0.dev0: Accounting for case `num_generations_eval=1` in the calc"),
    ("26f989efa", "0.27.0.dev0: Fix vLLM error for tools usage not supported when runnin"),
    ("50bc2480f", "0.27.0.dev0: Support async reward functions and parallelize call to r"),
    ("8918c9836", "0.27.0.dev0: Overwrite model default generation config used by model."),
    ("ef40b1b10", "0.28.0.dev0: Fix CI with dev dependencies: Mark Qwen3-VL tests as xfa"),
    ("7c4b6f169", "0.28.0.dev0: Fix: undefined `current_gradient_accumulation_steps` (#4"),
]


def contains(git, ancestor, commit):
    """Whether ``commit`` of TRL's history contains ``ancestor`` (git merge-base --is-ancestor)."""
    found = subprocess.run(["git", "--git-dir", str(git), "merge-base", "--is-ancestor", ancestor, commit], capture_output=True)
    if found.returncode not in (0, 1):
        raise RuntimeError(f"git merge-base --is-ancestor {ancestor} {commit}: {found.stderr.decode().strip()}")
    return found.returncode == 0


def expected_at(git, commit):
    """Patch id -> whether its bug is in ``commit``'s code, for every patch of BUG_SPANS."""
    return {
        pid: (brought is None or contains(git, brought, commit)) and (fixed is None or not contains(git, fixed, commit))
        for pid, (brought, fixed) in BUG_SPANS.items()
    }


COMMITS += [(commit, label, None) for commit, label in COMMITS_0_2X]  # None: expected_at() when built
