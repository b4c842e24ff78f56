"""Benchmark for the logits-to-keep patch: peak memory and time of TRL's `_get_per_token_logps`.

One run measures three variants, each in its own fresh child process, one after the other:

* ``unpatched``: TRL 0.15.2 on transformers 4.48.3 without trl_compat. TRL passes
  ``logits_to_keep``, Qwen2 only knows ``num_logits_to_keep`` and swallows it: full [B, L, V] logits.
* ``patched``: the same venv with ``import trl_compat``: the request reaches Qwen2 as
  ``num_logits_to_keep``, so only [B, K+1, V] logits are computed.
* ``native``: the same TRL 0.15.2 on transformers 4.50.3, where Qwen2 takes ``logits_to_keep``
  itself: the reference the patch should match.

The model is a small Qwen2 built in code with a real vocabulary (151,936, tied embeddings) so that
the logits dominate, as they do for Qwen2.5-0.5B..7B; batch 4, prompt 512, completion 64.
Two uses of the function are measured:

* ``ref``: under ``torch.inference_mode()``, as TRL computes the reference model's log-probs;
* ``policy``: with autograd on, the call plus ``backward()`` of the mean log-prob, as in the loss.

Peak memory is the process's peak resident set size during the call (``VmHWM``, reset through
``/proc/self/clear_refs`` right before it) minus the resident size just before it: the extra
memory the call needs. ``MALLOC_MMAP_THRESHOLD_`` makes glibc give freed blocks back at once, so
a warm-up call does not leave memory behind that a later call would reuse unseen. The variants
run in interleaved rounds (unpatched, patched, native, unpatched, ...) so that load from other
jobs on a shared machine falls on all of them; time is the median over all measured calls.
Every variant also returns its log-probs, which must agree across variants.

    tox -e bench-logits_to_keep                          # writes benchmarks/logits_to_keep.md
    python benchmarks/logits_to_keep.py --rounds 5 --out /tmp/x.md

unpatched and patched run on the interpreter running this script (``--python`` to change it:
a venv of the matrix cell trl0.15.2-tf4.48.3, as tox's env is). native runs on the same
interpreter with transformers ``--native-transformers`` (4.50.3) laid over it: installed with
``pip install --no-deps --target <--overlay-dir>/...`` and put first on ``PYTHONPATH`` (only
transformers differs; ``--python-native`` runs it on another interpreter instead). Not part of
the default test run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import _measure

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SHAPE = dict(vocab=151_936, hidden=256, layers=2, heads=4, kv_heads=2, intermediate=704, batch=4, prompt=512, completion=64)
TARGET = 1.05  # patched peak memory within 1.05x of native


# -- child: one variant -------------------------------------------------------------------------


def child(mode: str, repeats: int) -> dict:
    sys.path.insert(0, REPO)
    if mode != "unpatched":
        import trl_compat  # noqa: F401  - before trl, as a user would

    import types

    import torch
    import transformers
    import trl
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.trainer.grpo_trainer import GRPOTrainer

    s = SHAPE
    config = Qwen2Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        use_sliding_window=False,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).eval()
    rows = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: rows.append(tuple(out.shape)))

    gen = torch.Generator().manual_seed(1)
    length = s["prompt"] + s["completion"]
    ids = torch.randint(0, s["vocab"], (s["batch"], length), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, :17] = 0  # one left-padded prompt
    k = s["completion"]
    stub = types.SimpleNamespace(temperature=1.0, args=types.SimpleNamespace(report_to=[]))

    def ref_call():
        with torch.inference_mode():
            return GRPOTrainer._get_per_token_logps(stub, model, ids, mask, k)

    def policy_call():
        model.zero_grad(set_to_none=True)
        logps = GRPOTrainer._get_per_token_logps(stub, model, ids, mask, k)
        logps.mean().backward()
        return logps.detach()

    out = dict(mode=mode, versions=dict(trl=trl.__version__, transformers=transformers.__version__, torch=torch.__version__))
    if mode != "unpatched":
        out["trl_compat_status"] = sys.modules["trl_compat"].status("logits-to-keep")
    out["ref"], logps = _measure.measure(ref_call, repeats)
    out["ref"]["lm_head_out"] = list(rows[-1])
    out["policy"], _ = _measure.measure(policy_call, repeats)
    out["policy"]["lm_head_out"] = list(rows[-1])
    out["forward_wrapped"] = "forward" in vars(model)
    out["logps"] = logps.tolist()
    if mode == "patched":
        out["overhead_us"] = _overhead()
    return out


def _overhead(n: int = 20000) -> dict:
    """The patch's own cost per TRL call, without any model work: ``prepare_model`` on an
    already-prepared model, and the wrapped forward vs the bare one on a module that does nothing."""
    from trl_compat.patches.logits_to_keep.prepare import prepare_model

    import torch

    class Nothing(torch.nn.Module):
        def forward(self, input_ids, num_logits_to_keep=0):
            return input_ids

    bare, wrapped = Nothing(), Nothing()
    prepare_model(wrapped)
    assert "forward" in vars(wrapped)

    def per_call(fn):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e6

    return dict(
        prepare_model=per_call(lambda: prepare_model(wrapped)),
        forward_wrapped=per_call(lambda: wrapped.forward(1, logits_to_keep=2)),
        forward_bare=per_call(lambda: bare.forward(1, num_logits_to_keep=2)),
    )


# -- parent: run the variants, write the report --------------------------------------------------


def run_child(python: str, mode: str, repeats: int, pythonpath: str = "") -> dict:
    env = dict(
        os.environ,
        **_measure.MALLOC_ENV,
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        TRL_COMPAT_STRICT="1",
        PYTHONWARNINGS="ignore",
    )
    env.pop("TRL_COMPAT_DISABLE", None)
    env.pop("PYTHONPATH", None)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    cmd = [python, os.path.abspath(__file__), "--child", mode, "--repeats", str(repeats)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


mib = _measure.mib


def spread(r: dict) -> str:
    return f"{r['seconds']:.2f} ({min(r['seconds_all']):.2f}-{max(r['seconds_all']):.2f})"


def report(results: dict, args, wall: float) -> str:
    un, pa, na = results["unpatched"], results["patched"], results["native"]
    s = SHAPE
    full = s["batch"] * (s["prompt"] + s["completion"]) * s["vocab"] * 4
    kept = s["batch"] * (s["completion"] + 1) * s["vocab"] * 4
    lines = [
        "# logits-to-keep: peak memory and time of `GRPOTrainer._get_per_token_logps`",
        "",
        f"Generated by `tox -e bench-logits_to_keep` on {time.strftime('%Y-%m-%d')} "
        f"({platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"torch {pa['versions']['torch']}; {args.rounds} interleaved rounds x {args.repeats} measured calls per "
        f"variant; whole run {wall:.0f} s; 1-min load average {args.load[0]:.1f} at start, {args.load[1]:.1f} at end).",
        "",
        f"Model: Qwen2ForCausalLM built in code, vocab {s['vocab']:,} (tied embeddings), hidden {s['hidden']}, "
        f"{s['layers']} layers, float32. Input: batch {s['batch']}, prompt {s['prompt']}, "
        f"completion {s['completion']} (K). TRL {pa['versions']['trl']} for all three variants; only transformers "
        "and trl_compat differ. Each variant ran in a fresh process.",
        "",
        "Peak memory = peak RSS during the call minus RSS just before it, highest over all calls (MiB); "
        "time = median wall time over all calls, (min-max) in brackets (s). The machine is shared with other jobs: "
        "memory is exact, times are rough.",
        f"For scale: fp32 logits [B, L, V] = {mib(full)} MiB, [B, K+1, V] = {mib(kept)} MiB.",
        "",
        "| variant | transformers | trl_compat | lm_head output | ref: peak MiB | ref: time s "
        "| policy (+backward): peak MiB | policy: time s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    labels = {"unpatched": "unpatched 4.48", "patched": "patched 4.48", "native": "native >= 4.50 (reference)"}
    for mode in ("unpatched", "patched", "native"):
        r = results[mode]
        status = r.get("trl_compat_status", "not imported")
        lines.append(
            f"| {labels[mode]} | {r['versions']['transformers']} | {status} | {r['ref']['lm_head_out']} "
            f"| {mib(r['ref']['peak_bytes'])} | {spread(r['ref'])} "
            f"| {mib(r['policy']['peak_bytes'])} | {spread(r['policy'])} |"
        )
    lines += [
        "",
        "Ratios against native:",
        "",
        "| variant | ref: memory | ref: time | policy: memory | policy: time |",
        "|---|---|---|---|---|",
    ]
    for mode in ("unpatched", "patched"):
        r = results[mode]
        lines.append(
            f"| {labels[mode]} | {r['ref']['peak_bytes'] / na['ref']['peak_bytes']:.2f}x "
            f"| {r['ref']['seconds'] / na['ref']['seconds']:.2f}x "
            f"| {r['policy']['peak_bytes'] / na['policy']['peak_bytes']:.2f}x "
            f"| {r['policy']['seconds'] / na['policy']['seconds']:.2f}x |"
        )
    import math

    def err(a, b):
        return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if math.isfinite(x - y))

    worst = max(pa["ref"]["peak_bytes"] / na["ref"]["peak_bytes"], pa["policy"]["peak_bytes"] / na["policy"]["peak_bytes"])
    lines += [
        "",
        f"Target: patched within {TARGET}x of native in peak memory: {'met' if worst <= TARGET else 'NOT met'} (worst {worst:.3f}x).",
        "",
        "The patch's own cost per call, without model work (mean over 20,000 calls): "
        f"`prepare_model` on a prepared model {pa['overhead_us']['prepare_model']:.1f} us; a wrapped forward "
        f"{pa['overhead_us']['forward_wrapped']:.1f} us vs {pa['overhead_us']['forward_bare']:.1f} us bare. "
        "Time differences between patched and native beyond that are load noise.",
        "",
        "Same values: max |log-prob difference| patched vs unpatched "
        f"{err(pa['logps'], un['logps']):.1e}, patched vs native {err(pa['logps'], na['logps']):.1e} (float32).",
        "",
        "Per-repeat peaks (MiB): "
        + "; ".join(
            f"{m} ref {[mib(x) for x in results[m]['ref']['peak_bytes_all']]}, "
            f"policy {[mib(x) for x in results[m]['policy']['peak_bytes_all']]}"
            for m in labels
        ),
        "",
        "Interpreters: " + "; ".join(f"{m}: {results[m]['python']}" for m in labels) + ".",
        "",
    ]
    return "\n".join(lines)


def merge(runs: list) -> dict:
    """One child output per round -> one result: the highest peak, the median time over all repeats."""
    out = dict(runs[0])
    for use in ("ref", "policy"):
        peaks = [x for r in runs for x in r[use]["peak_bytes_all"]]
        times = [x for r in runs for x in r[use]["seconds_all"]]
        out[use] = dict(runs[0][use], peak_bytes=max(peaks), peak_bytes_all=peaks, seconds=statistics.median(times), seconds_all=times)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--child", choices=["unpatched", "patched", "native"], help=argparse.SUPPRESS)
    p.add_argument("--repeats", type=int, default=2, help="measured calls per child process (after a warm-up)")
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (unpatched, patched, native) children, interleaved so CPU contention is shared",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter for unpatched and patched (default: this one)")
    p.add_argument("--python-native", help="interpreter for native (default: --python with --native-transformers)")
    p.add_argument("--native-transformers", default="4.50.3", help="transformers release laid over --python for native")
    p.add_argument("--overlay-dir", help="where to install it (default: a temporary directory)")
    p.add_argument("--out", default=os.path.join(HERE, "logits_to_keep.md"))
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.repeats)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        overlay = ""
        if not args.python_native:
            overlay = os.path.join(args.overlay_dir or tmp, f"transformers-{args.native_transformers}")
            if not os.path.isdir(os.path.join(overlay, "transformers")):
                subprocess.run(
                    [
                        args.python,
                        "-m",
                        "pip",
                        "install",
                        "-q",
                        "--no-deps",
                        "--target",
                        overlay,
                        f"transformers=={args.native_transformers}",
                    ],
                    check=True,
                )
        start, load_before = time.time(), os.getloadavg()[0]
        pythons = {
            "unpatched": (args.python, ""),
            "patched": (args.python, ""),
            "native": (args.python_native or args.python, overlay),
        }
        runs = {mode: [] for mode in pythons}
        for round_ in range(args.rounds):
            for mode, (python, pythonpath) in pythons.items():
                print(f"round {round_ + 1}/{args.rounds}: {mode}", file=sys.stderr, flush=True)
                runs[mode].append(run_child(python, mode, args.repeats, pythonpath))
    if runs["native"][0]["versions"]["transformers"] == runs["patched"][0]["versions"]["transformers"]:
        raise SystemExit("native runs the same transformers as patched: not a reference")
    how = {
        "unpatched": "the running interpreter",
        "patched": "the same",
        "native": (
            "`--python-native`"
            if args.python_native
            else f"the same, transformers {args.native_transformers} laid over it (`pip install --no-deps "
            "--target`, first on `PYTHONPATH`)"
        ),
    }
    results = {mode: dict(merge(r), python=how[mode]) for mode, r in runs.items()}
    args.load = (load_before, os.getloadavg()[0])
    text = report(results, args, time.time() - start)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)


if __name__ == "__main__":
    main()
