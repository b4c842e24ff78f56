"""Sweep every TRL release on PyPI from 0.14.0 to the newest: import trl_compat,
import TRL's GRPO modules, take ``trl_compat.report()``; write matrix/SWEEP.md.

trl is pure Python, so each release is swapped (``pip install --no-deps``) into one
base venv per transformers line instead of building a venv per release:

* releases <= 0.19 use the 0.19.1 cell's pins (transformers 4.53.3) plus deepspeed 0.16.4;
* later 0.x releases use transformers 4.57.6 and 1.x releases the ``trl-newest`` cell's
  pins (transformers 5.x), unless the release's own ``Requires-Dist`` excludes it.

A row is flagged when importing trl_compat or taking the report raises, when a
traceback through trl_compat escapes into an import, or when a patch applies to a
release outside the window where research found its bug (``KNOWN`` below, kept
independent of the patches' own windows on purpose).

With ``--trl-git PATH`` (a clone of TRL's git history, bare or not) it also builds the
main-branch commits the patch docstrings name (``COMMITS``: each dev build around a window's
bound, on both sides of the fix, or of the commit that brought the bug) into the matching base
venv and checks the statuses of the patches each entry lists against that table, kept
independent of the probes (it says which fix commits each build contains; for the 0.21 - 0.28
builds, ``BUG_SPANS`` gives the commits that brought and fixed each bug, and ``git merge-base
--is-ancestor`` on the clone says which the build contains, kept with the row); the other patches
are judged by ``KNOWN`` on the build's dev version. An opt-in patch whose probe finds the bug
reports "disabled" (the sweep sets no switch), which counts as applying. Without ``--trl-git``
those rows are skipped, and SWEEP.md says so.

Usage: python matrix/sweep.py [--work DIR] [--versions 0.14.0,0.15.0] [--trl-git PATH] [--output matrix/SWEEP.md]
"""

import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import zipfile

from packaging.requirements import Requirement
from packaging.version import Version

ROOT = pathlib.Path(__file__).resolve().parent.parent
CELLS = ROOT / "matrix" / "cells"
FIRST = Version("0.14.0")

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
}

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

CHECK = r"""
import json, traceback
out = {"crash": None, "imports": {}, "report": []}
try:
    import trl_compat
except Exception:
    out["crash"] = traceback.format_exc()
else:
    for name in ("trl.trainer.grpo_trainer", "trl.models.utils"):
        try:
            __import__(name)
            out["imports"][name] = "ok"
        except Exception as exc:
            tb = traceback.format_exc()
            out["imports"][name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            # trl_compat's fault only where it raised: its import hook is a frame of every import it
            # waits for, so a TRL import error passes through it
            if "trl_compat" in traceback.extract_tb(exc.__traceback__)[-1].filename:
                out["crash"] = tb
    try:
        out["report"] = [r.as_dict() for r in trl_compat.report()]
    except Exception:
        out["crash"] = traceback.format_exc()
import importlib.metadata as md
def ver(d):
    try: return md.version(d)
    except md.PackageNotFoundError: return None
out["versions"] = {d: ver(d) for d in ("trl", "transformers", "deepspeed", "peft", "accelerate", "vllm")}
print("SWEEP-JSON " + json.dumps(out))
"""


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, text=True, capture_output=True, **kw)


def pins(cell, drop=("trl",)):
    lines = []
    for line in (CELLS / f"{cell}.txt").read_text().splitlines():
        line = line.strip()
        # a path line (./tests/vllm_standin/vX: the stand-in as a cell installs it) is not a pin: bases choose their own
        if line and not line.startswith(("#", "./")) and Requirement(line).name.lower() not in drop:
            lines.append(line)
    return lines


BASES = {
    # rich: a core requirement of trl 0.14-0.17 that the newer pins lack
    # the vLLM stand-in: the main-branch rows check the vLLM patches' probes, which need vllm installed
    "tf4.53": lambda: pins("trl0.19.1-tf4.53.3") + ["deepspeed==0.16.4", "rich", str(ROOT / "tests" / "vllm_standin" / "v0.9.1")],
    "tf4.57": lambda: [
        "torch==2.13.0",
        "transformers==4.57.6",
        "accelerate",
        "datasets",
        "peft",
        "deepspeed==0.19.8",
        # the vLLM stand-in as the vLLM TRL 0.24 pins: the vLLM patches' probes are judged too
        str(ROOT / "tests" / "vllm_standin" / "v0.10.2"),
        "pytest",
        "wrapt",
        "packaging",
        "rich",
    ],
    # requests: TRL 1.0 - 1.14's vllm_client imports it without declaring it; the vLLM stand-in as a
    # vLLM every 1.x release accepts, so that the 1.x rows judge the vLLM patches' probes (sleep mode)
    "tf5": lambda: pins("trl-newest") + ["rich", "requests", str(ROOT / "tests" / "vllm_standin" / "v0.17.0")],
}


_CURRENT = set()  # the bases this process put this tree's trl_compat into


def base_python(work, name):
    venv = work / f"base-{name}"
    python = venv / "bin" / "python"
    if not (venv / ".ready").exists():
        t0 = time.time()
        run([sys.executable, "-m", "venv", "--clear", str(venv)])
        run([str(python), "-m", "pip", "install", "-q", *BASES[name]()])
        (venv / ".ready").write_text(f"{time.time() - t0:.0f}s\n")
    if name not in _CURRENT:
        # a kept base holds the trl_compat of the sweep that built it: the tree's own, once per sweep
        run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(ROOT)])
        _CURRENT.add(name)
    return python


def trl_releases():
    out = run([sys.executable, "-m", "pip", "index", "versions", "trl"]).stdout
    listed = re.search(r"Available versions: (.*)", out).group(1).split(", ")
    return sorted(V(v) for v in listed if not V(v).is_prerelease and V(v) >= FIRST)


def wheel_requirements(wheel):
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]


def base_transformers(work, name):
    python = base_python(work, name)
    code = "import importlib.metadata as m; print(m.version('transformers'))"
    return V(run([str(python), "-c", code]).stdout.strip())


def choose_base(work, version, reqs):
    if version < V("0.20.0"):
        return "tf4.53"
    spec = next((r.specifier for r in reqs if r.name == "transformers"), None)
    # 0.x releases met transformers 4.x; 1.x releases came with transformers 5
    for name in ("tf4.57", "tf5") if version < V("1.0.0") else ("tf5", "tf4.57"):
        if spec is None or spec.contains(base_transformers(work, name), prereleases=True):
            return name
    return "tf4.57"


def sweep_one(work, version):
    wheels = work / "wheels"
    wheels.mkdir(exist_ok=True)
    found = list(wheels.glob(f"trl-{version}-*.whl"))
    if not found:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(wheels),
                f"trl=={version}",
            ]
        )
        found = list(wheels.glob(f"trl-{version}-*.whl"))
    reqs = wheel_requirements(found[0])
    base = choose_base(work, version, reqs)
    python = base_python(work, base)
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(found[0])])
    return check(python, str(version), base)


def check(python, version, base):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRL_COMPAT_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([str(python), "-c", CHECK], text=True, capture_output=True, env=env, timeout=600)
    line = next((out for out in proc.stdout.splitlines() if out.startswith("SWEEP-JSON ")), None)
    if line is None:
        return {
            "version": version,
            "base": base,
            "crash": f"checker died (rc {proc.returncode}): {proc.stderr[-800:]}",
            "imports": {},
            "report": [],
            "versions": {},
        }
    data = json.loads(line[len("SWEEP-JSON ") :])
    data.update(version=version, base=base)
    return data


def source_version(src):
    """The version a TRL source tree builds: its VERSION file (from 0.23), else the literal
    ``__version__`` of trl/__init__.py (before; later trees read it from the installed metadata)."""
    if (src / "VERSION").exists():
        return V((src / "VERSION").read_text().strip())
    return V(re.search(r'__version__ = "([^"]+)"', (src / "trl" / "__init__.py").read_text()).group(1))


def sweep_commit(work, git, commit):
    """Build ``commit`` of TRL from the clone at ``git`` and check it like a release."""
    src = work / "src" / commit
    if not (src / "setup.py").exists() and not (src / "pyproject.toml").exists():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "--git-dir", git, "archive", "--format=tar", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dev = source_version(src)
    python = base_python(work, choose_base(work, dev, []))
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(src)])
    row = check(python, f"{dev}@{commit}", choose_base(work, dev, []))
    # kept with the row: --no-run judges it again without the clone
    row["expect"] = next(e for c, _, e in COMMITS if c == commit) or expected_at(git, commit)
    return row


def finds_bug(rec):
    """Whether a report record says its probe found the bug: "applied", or "disabled" for an opt-in patch.

    check() runs without any TRL_COMPAT_ variable, so an opt-in patch (logps-temperature) whose probe
    finds the bug reports "disabled" with a reason starting "opt-in, off"; were its switch set, it would
    report "applied". "disabled" for any other reason (TRL_COMPAT_DISABLE) says nothing about the code."""
    if rec["status"] == "applied":
        return True
    return rec["status"] == "disabled" and rec.get("reason", "").startswith("opt-in, off")


def judge(row):
    version, _, commit = row["version"].partition("@")
    v = V(version)
    versions = row.get("versions", {})
    expect = (row.get("expect") or next((e for c, _, e in COMMITS if c == commit), None) or {}) if commit else {}
    problems = []
    if row["crash"]:
        problems.append("CRASH")
    status = {rec["id"]: rec["status"] for rec in row["report"]}
    found = {rec["id"] for rec in row["report"] if finds_bug(rec)}
    for pid, applies in expect.items():
        if (pid in found) != applies:
            problems.append(f"WRONG {pid}")
    for pid, st in status.items():
        known = KNOWN.get(pid, lambda *_: False)
        # a dev build of X carries code of the line before X or of X itself: either may hold the bug
        expected = known(v, versions) or (commit and known(V(v.base_version), versions))
        if pid not in expect and st == "applied" and not expected:
            problems.append(f"WRONG {pid}")
    return problems


def write(rows, output, seconds, commits_note):
    ids = []
    for row in rows:
        for rec in row["report"]:
            if rec["id"] not in ids:
                ids.append(rec["id"])
    crashes = sum(bool(r["crash"]) for r in rows)
    wrong = sum(p.startswith("WRONG") for r in rows for p in judge(r))
    lines = [
        "# Sweep: every TRL release from 0.14.0 to the newest",
        "",
        f"Written by `matrix/sweep.py` ({len(rows)} builds, {seconds:.0f} s). Each build was swapped into a",
        "base venv (`--no-deps`), then `import trl_compat`, `import trl.trainer.grpo_trainer, trl.models.utils`",
        "and `trl_compat.report()` ran in a fresh process, without `TRL_COMPAT_STRICT`.",
        "",
        f"**{crashes} crashes, {wrong} wrong applications.** A wrong application is a patch applied to a release",
        "outside the window where research found its bug (for a main-branch build `X.devN@commit`: the windows of",
        "X.devN and of X), or a patch the commit's entry lists (`COMMITS` in the script) whose status differs from what",
        'research found in that code (for an opt-in patch, off in the sweep, "disabled" is how it finds the bug).',
        "Short statuses: A applied, - not needed, P pending",
        "(its module did not import), U undecided, ? unknown version, M target missing, F failed, D disabled.",
        "",
        commits_note,
        "",
        "| trl | base (transformers) | grpo import | " + " | ".join(f"`{i}`" for i in ids) + " | flags |",
        "|---|---|---|" + "---|" * len(ids) + "---|",
    ]
    short = {
        "applied": "A",
        "not needed": "-",
        "pending": "P",
        "undecided": "U",
        "unknown version": "?",
        "target missing": "M",
        "failed": "F",
        "disabled": "D",
        "reverted": "R",
    }
    for row in rows:
        status = {rec["id"]: rec["status"] for rec in row["report"]}
        grpo = row["imports"].get("trl.trainer.grpo_trainer", "-")
        tf = row.get("versions", {}).get("transformers")
        lines.append(
            f"| {row['version']} | {row['base']} ({tf}) | {'ok' if grpo == 'ok' else grpo.replace('|', '/')} | "
            + " | ".join(short.get(status.get(i), status.get(i, "")) for i in ids)
            + f" | {', '.join(judge(row)) or 'ok'} |"
        )
    notes = [
        (row["version"], rec["id"], rec["status"], rec["reason"])
        for row in rows
        for rec in row["report"]
        if rec["status"] in ("undecided", "target missing", "failed", "unknown version")
    ]
    if notes:
        lines += ["", "## Patches that could not decide or apply", ""]
        lines += [f"- trl {v} `{pid}`: {st}: {reason}" for v, pid, st, reason in notes]
    for row in rows:
        if row["crash"]:
            lines += ["", f"## Crash on trl {row['version']}", "", "```", row["crash"][-2000:], "```"]
    pathlib.Path(output).write_text("\n".join(lines) + "\n")
    print(f"sweep: {len(rows) - crashes - wrong} passed, {crashes + wrong} failed")
    return 1 if crashes or wrong else 0


def _saved_rows(path):
    """The rows a ``--rows`` file holds, by build (a release's version or a commit)."""
    if not path or not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as lines:
        return {entry["key"]: entry["row"] for entry in map(json.loads, lines)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default=str(ROOT / ".tox" / "sweep-work"))
    parser.add_argument("--versions", default="")
    parser.add_argument("--trl-git", default="", help="a clone of TRL's git history: also check COMMITS")
    parser.add_argument("--only-commits", action="store_true", help="skip the releases (with --trl-git)")
    parser.add_argument("--output", default=str(ROOT / "matrix" / "SWEEP.md"))
    parser.add_argument(
        "--rows",
        default="",
        help="a JSON-lines file: each finished build's row is appended to it, and builds already in it are not run "
        "again (a sweep stopped half-way resumes; delete the file after changing trl_compat)",
    )
    parser.add_argument("--commits", default="", help="only these COMMITS (comma-separated), with --trl-git")
    parser.add_argument("--no-run", action="store_true", help="write the output from the --rows file only")
    args = parser.parse_args()
    work = pathlib.Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    versions = [] if args.only_commits else [V(v) for v in args.versions.split(",") if v] or trl_releases()
    git = pathlib.Path(args.trl_git) if args.trl_git else None
    if git is not None and (git / ".git").exists():
        git = git / ".git"
    if git is None:
        note = (
            f"The {len(COMMITS)} main-branch commits in `COMMITS` were skipped: no `--trl-git` "
            "(a clone of TRL's git history) was given."
        )
        print("sweep: " + note, flush=True)
    else:
        note = f"The {len(COMMITS)} main-branch commits in `COMMITS` were built from a clone of TRL's git history."
    t0 = time.time()
    saved = _saved_rows(args.rows)
    rows = []
    chosen = [c for c, _, _ in COMMITS if not args.commits or c in args.commits.split(",")]
    jobs = [(sweep_one, v) for v in versions] + ([(sweep_commit, c) for c in chosen] if git or args.no_run else [])
    left_out = 0
    for job, arg in jobs:
        key = str(arg) if job is sweep_one else arg
        if key in saved:
            rows.append(saved[key])
            continue
        if args.no_run:
            left_out += 1
            continue
        started = time.time()
        row = job(work, arg) if job is sweep_one else job(work, str(git), arg)
        row["seconds"] = time.time() - started
        rows.append(row)
        if args.rows:
            with open(args.rows, "a", encoding="utf-8") as out:
                out.write(json.dumps({"key": key, "row": row}) + "\n")
        print(
            f"trl {row['version']:>8} [{row['base']}]: "
            + " ".join(f"{r['id']}={r['status']}" for r in row["report"])
            + f"  {judge(row) or ''}",
            flush=True,
        )
    if left_out:
        note += f" {left_out} of the {len(jobs)} builds were not run yet (a partial sweep: `--rows` resumes it)."
    # the builds' own time, summed: a resumed sweep counts the rows it read back too
    return write(rows, args.output, sum(row.get("seconds", 0.0) for row in rows) or time.time() - t0, note)


if __name__ == "__main__":
    sys.exit(main())
