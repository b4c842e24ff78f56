"""Benchmark: pushing a LoRA policy's weights into vLLM, three ways.

* ``trl_compat``: :func:`trl_compat.vllm_sync.push_to_vllm`, merged tensors computed out
  of place, one layer at a time, streamed into ``load_weights``.
* ``deepcopy+merge``: ``copy.deepcopy(model).merge_and_unload().state_dict()`` (the
  workaround posted in TRL issue #2856).
* ``upstream 0.15.1``: TRL 0.15.1's ``_move_model_to_vllm`` logic, verbatim minus the
  accelerate plumbing: ``merge_adapter()``, cleaned ``state_dict()``, ``load_weights``,
  ``unmerge_adapter()`` on the live weights.

The model is a Qwen2 built in code (no download): hidden 1024, MLP 2816, 8 layers, 16/4
heads, vocab 32000, untied; LoRA r=16, alpha=32 on all attention and MLP projections, with
non-zero adapter weights. The receiver behaves like vLLM's ``load_weights``: it consumes the
iterable item by item and copies each tensor into its own preallocated parameters.

Each (approach, dtype) runs in a fresh process. Time: median of ``--repeats`` syncs after a
warm-up. Peak extra memory: the process's peak RSS during a sync minus its RSS just before
(``/proc/self/clear_refs`` resets the peak; glibc is told to mmap every allocation >= 64 KiB,
so freed tensors leave RSS at once). Drift: how far the base weights of the training model
are from their initial bits after 1 and 10 syncs.

Run:  python benchmarks/vllm_sync.py            (writes benchmarks/vllm_sync.md)
Needs torch, transformers, peft and trl_compat importable; not trl, not vLLM.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
APPROACHES = ("trl_compat", "deepcopy+merge", "upstream 0.15.1")
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(dtype_name):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    dtype = getattr(torch, dtype_name)
    config = Qwen2Config(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=8,
                         num_attention_heads=16, num_key_value_heads=4, tie_word_embeddings=False,
                         max_position_embeddings=512)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS,
                                                 init_lora_weights=False))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.mul_(0.05)  # adapter-sized deltas, as after some training
    return model


class Receiver:
    """vLLM-like: streams the iterable, copies each tensor into its own preallocated storage."""

    def __init__(self, plain_state):
        import torch

        self.params = {name: torch.empty_like(t) for name, t in plain_state.items()}
        self.calls = 0

    def load_weights(self, weights):
        self.calls += 1
        loaded = set()
        for name, tensor in weights:
            self.params[name].copy_(tensor)
            loaded.add(name)
        missing = set(self.params) - loaded
        if missing:
            raise KeyError(f"not received: {sorted(missing)[:3]}")
        return loaded


def sync_trl_compat(model, receiver):
    from trl_compat.vllm_sync import push_to_vllm

    push_to_vllm(model, receiver)


def sync_deepcopy(model, receiver):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        merged = copy.deepcopy(model).merge_and_unload()
    receiver.load_weights(merged.state_dict().items())
    del merged


def sync_upstream(unwrapped_model, receiver):
    # TRL 0.15.1 GRPOTrainer._move_model_to_vllm, PEFT branch.
    unwrapped_model.merge_adapter()
    state_dict = unwrapped_model.state_dict()
    state_dict = {k.removeprefix("base_model.model.").replace(".base_layer", ""): v for k, v in state_dict.items()}
    state_dict = {k: v for k, v in state_dict.items() if unwrapped_model.prefix not in k}
    state_dict = {k.replace("modules_to_save.default.", ""): v for k, v in state_dict.items()
                  if "original_module" not in k}
    receiver.load_weights(state_dict.items())
    unwrapped_model.unmerge_adapter()


SYNCS = {"trl_compat": sync_trl_compat, "deepcopy+merge": sync_deepcopy, "upstream 0.15.1": sync_upstream}


def _status(field):
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def _reset_peak():
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def worker(approach, dtype_name, repeats):
    import torch

    model = build(dtype_name)
    base = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = copy.deepcopy(model).merge_and_unload().state_dict()
    receiver = Receiver(expected)
    model_bytes = sum(t.numel() * t.element_size() for t in expected.values())
    largest = max(m.base_layer.weight.numel() * m.base_layer.weight.element_size()
                  for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer"))
    sync = SYNCS[approach]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sync(model, receiver)  # warm-up; also the "1 sync" drift point
        drift1 = _drift(model, base)
        exact = all(torch.equal(receiver.params[n], expected[n]) for n in expected)
        times, peaks = [], []
        for _ in range(repeats):
            gc.collect()
            before = _status("VmRSS")
            _reset_peak()
            t0 = time.perf_counter()
            sync(model, receiver)
            times.append(time.perf_counter() - t0)
            peaks.append(_status("VmHWM") - before)
        for _ in range(10 - 1 - repeats):
            sync(model, receiver)
        drift10 = _drift(model, base)
    return dict(approach=approach, dtype=dtype_name, time_s=statistics.median(times), times=times,
                peak_extra_bytes=max(peaks), model_bytes=model_bytes, largest_merged_bytes=largest,
                received_exactly_merged=exact, drift1=drift1, drift10=drift10)


def _drift(model, base):
    changed = total = 0
    worst = 0.0
    for name, param in model.named_parameters():
        if name in base:
            diff = param.detach() != base[name]
            changed += int(diff.sum())
            total += diff.numel()
            if diff.any():
                worst = max(worst, float((param.detach().float() - base[name].float()).abs().max()))
    return dict(changed=changed, total=total, max_abs=worst)


def _run(approach, dtype_name, repeats):
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), TRL_COMPAT_DISABLE="*")
    out = subprocess.run([sys.executable, __file__, "--worker", approach, dtype_name, str(repeats)],
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _mb(n):
    return f"{n / 2**20:,.0f} MB"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--out", default=os.path.join(HERE, "vllm_sync.md"))
    args = parser.parse_args()
    import peft
    import torch
    import transformers

    load_before = os.getloadavg()[0]
    rows = [_run(a, d, args.repeats) for d in args.dtypes.split(",") for a in APPROACHES]
    load_after = os.getloadavg()[0]
    lines = [
        "# vLLM weight sync with a LoRA policy: time and peak memory",
        "",
        f"Generated by `python benchmarks/vllm_sync.py` on {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {platform.python_version()}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}, peft {peft.__version__}. CPU only; one process per row. "
        f"Load average {load_before:.1f} before / {load_after:.1f} after (a shared machine: times are "
        "indicative; memory and drift do not depend on load).",
        "",
        "Model: Qwen2 built in code (hidden 1024, MLP 2816, 8 layers, vocab 32000, untied), LoRA r=16 on "
        "q/k/v/o/gate/up/down with non-zero adapters. Receiver: copies each streamed tensor into "
        "preallocated storage, like vLLM's `load_weights`. *Peak extra* = peak RSS during one sync minus "
        "RSS before it. *Drift*: base weights of the training model compared bit for bit with their "
        "initial values after 1 and 10 syncs.",
        "",
        "| dtype | approach | time / sync | vs trl_compat | peak extra memory | vs model size | "
        "vLLM got exactly the merged weights | base weights changed after 1 sync | after 10 syncs (max abs) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dtype_name in args.dtypes.split(","):
        ours = next(r for r in rows if r["dtype"] == dtype_name and r["approach"] == "trl_compat")
        for r in (r for r in rows if r["dtype"] == dtype_name):
            d1, d10 = r["drift1"], r["drift10"]
            lines.append(
                f"| {dtype_name} | {r['approach']} | {r['time_s']:.3f} s | {r['time_s'] / ours['time_s']:.2f}x | "
                f"{_mb(r['peak_extra_bytes'])} | {r['peak_extra_bytes'] / r['model_bytes']:.2f}x | "
                f"{'yes' if r['received_exactly_merged'] else 'no'} | "
                f"{d1['changed']:,} of {d1['total']:,} | {d10['changed']:,} ({d10['max_abs']:.1e}) |"
            )
    lines.append("")
    first = rows[0]
    lines += [
        f"Model size: {_mb(first['model_bytes'])} in float32; the largest LoRA-wrapped weight "
        f"(one merged tensor) is {_mb(first['largest_merged_bytes'])} in float32.",
        "",
        "Reading it: trl_compat's peak is about two merged tensors in float32 (the one being computed "
        "and the one the receiver still holds while it asks for the next). In bfloat16, PEFT keeps "
        "the adapters in float32 (`autocast_adapter_dtype`), so each delta is computed in float32 "
        "before rounding, as PEFT's own merge does. deepcopy+merge holds a whole second model. "
        "Upstream 0.15.1 needs no copy either, but merge + unmerge on the live weights is not "
        "bit-exact: the training model's base weights drift at the first sync.",
        "",
        "Raw results (seconds per repeat):",
        "",
        "```json",
        json.dumps([{k: v for k, v in r.items() if k != "drift1" and k != "drift10"} | {"drift1": r["drift1"],
                    "drift10": r["drift10"]} for r in rows], indent=1),
        "```",
        "",
    ]
    with open(args.out, "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines[:20 + 2 * len(rows)]))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        print(json.dumps(worker(sys.argv[2], sys.argv[3], int(sys.argv[4]))))
    else:
        main()
