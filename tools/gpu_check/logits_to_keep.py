"""logits-to-keep on CUDA in bf16: peak memory and time of TRL 0.15.2's ``GRPOTrainer._get_per_token_logps``
(the CPU version is benchmarks/logits_to_keep.py). Run by runner.py, a process per variant.

    python tools/gpu_check/logits_to_keep.py --mode unpatched|patched|native --save DIR    one variant, one JSON line
    python tools/gpu_check/logits_to_keep.py --compare DIR                                 log-prob agreement

unpatched: TRL 0.15.2 on transformers 4.48.3 (Qwen2 swallows logits_to_keep: full [B, L, V] logits);
patched: the same + ``import trl_compat`` (TRL_COMPAT_STRICT=1); native: transformers 4.50.3 (the reference).
Model: random-init Qwen2 of Qwen2.5-0.5B's shape (weights set per parameter name, so every variant
has the same ones whatever transformers' init does), bf16 on CUDA; batch 8, prompt 1024, completion 256.
ref = under torch.inference_mode (reference model use); policy = autograd + backward of the mean (loss use).
Peak = torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus memory_allocated before the call.
TRL_COMPAT_GPU_DRY_RUN=1: CPU, float32, 2 layers, batch 2, prompt 128, completion 32, no memory stats.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import types
import zlib

DRY = os.environ.get("TRL_COMPAT_GPU_DRY_RUN", "") == "1"
T0 = time.time()
SHAPE = dict(vocab=151_936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, batch=8, prompt=1024, completion=256)
if DRY:
    SHAPE.update(layers=2, batch=2, prompt=128, completion=32)
REPEATS = 2 if DRY else 5


def emit(row: dict) -> None:
    print("@@JSON " + json.dumps(row, default=str), flush=True)


def child(mode: str, save: str) -> dict:
    if mode == "patched":
        import trl_compat  # noqa: F401 - before trl, as a user would

    import torch
    import transformers
    import trl
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from trl.trainer.grpo_trainer import GRPOTrainer

    cuda = torch.cuda.is_available() and not DRY
    dev = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    s = SHAPE
    row = dict(
        part="B",
        mode=mode,
        shape=s,
        dryrun=DRY,
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        versions=dict(torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__),
        import_s=round(time.time() - T0, 1),
    )
    if mode == "patched":
        row["trl_compat_status"] = sys.modules["trl_compat"].status("logits-to-keep")
    config = Qwen2Config(
        vocab_size=s["vocab"],
        hidden_size=s["hidden"],
        intermediate_size=s["intermediate"],
        num_hidden_layers=s["layers"],
        num_attention_heads=s["heads"],
        num_key_value_heads=s["kv_heads"],
        max_position_embeddings=32768,
        rope_theta=1_000_000.0,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        attn_implementation="sdpa",
    )
    t = time.time()
    torch.manual_seed(0)
    with torch.device(dev):
        model = Qwen2ForCausalLM(config)
    model = model.to(dtype).eval()
    with torch.no_grad():  # the same weights in every variant, whatever transformers' own init does
        for name, p in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                g = torch.Generator(device=dev).manual_seed(zlib.crc32(name.encode()))
                p.normal_(0.0, 0.02, generator=g)
    row["n_params"] = sum(p.numel() for p in model.parameters())
    row["build_s"] = round(time.time() - t, 1)
    rows = []
    model.lm_head.register_forward_hook(lambda mod, inp, out: rows.append(tuple(out.shape)))

    gen = torch.Generator().manual_seed(1)
    length = s["prompt"] + s["completion"]
    ids = torch.randint(0, s["vocab"], (s["batch"], length), generator=gen).to(dev)
    mask = torch.ones_like(ids)
    mask[0, :17] = 0  # one left-padded prompt
    k = s["completion"]
    stub = types.SimpleNamespace(temperature=1.0, args=types.SimpleNamespace(report_to=[]))

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def ref_call():
        with torch.inference_mode():
            return GRPOTrainer._get_per_token_logps(stub, model, ids, mask, k)

    def policy_call():
        logps = GRPOTrainer._get_per_token_logps(stub, model, ids, mask, k)
        logps.float().mean().backward()
        return logps.detach()

    def measure(fn):
        out = fn()  # warm-up
        del out
        peaks, times, last = [], [], None
        for _ in range(REPEATS):
            model.zero_grad(set_to_none=True)
            last = None
            gc.collect()
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            last = fn()
            sync()
            times.append(time.perf_counter() - t0)
            if cuda:
                peaks.append(torch.cuda.max_memory_allocated() - base)
        model.zero_grad(set_to_none=True)
        r = dict(seconds=round(statistics.median(times), 5), seconds_all=[round(x, 5) for x in times], lm_head_out=list(rows[-1]))
        r["peak_mib"] = round(max(peaks) / 2**20, 1) if peaks else None
        r["peak_mib_all"] = [round(x / 2**20, 1) for x in peaks]
        return r, last

    for use, fn in (("ref", ref_call), ("policy", policy_call)):
        try:
            row[use], logps = measure(fn)
            lp = logps.float().cpu()
            row[use]["logps_finite"] = bool(lp.isfinite().all())
            row[use]["logps_shape"] = list(lp.shape)
            row[use]["logps_mean"] = round(float(lp.mean()), 5)
            if save:
                import numpy as np

                np.save(os.path.join(save, f"logps_{mode}_{use}.npy"), lp.numpy())
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            row[use] = dict(err=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300])
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    row["forward_wrapped"] = "forward" in vars(model)
    if cuda:
        row["process_peak_mib"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        row["weights_mib"] = round(sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20, 1)
    full = s["batch"] * length * s["vocab"] * (2 if cuda else 4)
    kept = s["batch"] * (k + 1) * s["vocab"] * (2 if cuda else 4)
    row["logits_mib_full_vs_kept"] = [round(full / 2**20, 1), round(kept / 2**20, 1)]
    row["ok"] = all("err" not in row.get(u, {}) for u in ("ref", "policy"))
    return row


def compare(d: str) -> list[dict]:
    import numpy as np

    out = []
    for use in ("ref", "policy"):
        arrs = {}
        for mode in ("unpatched", "patched", "native"):
            p = os.path.join(d, f"logps_{mode}_{use}.npy")
            if os.path.exists(p):
                arrs[mode] = np.load(p)
        pairs = [("patched", "unpatched"), ("patched", "native"), ("unpatched", "native")]
        res = dict(part="B", mode="compare", use=use, present=sorted(arrs))
        for a, b in pairs:
            if a in arrs and b in arrs and arrs[a].shape == arrs[b].shape:
                diff = np.abs(arrs[a].astype(np.float64) - arrs[b].astype(np.float64))
                fin = np.isfinite(diff)
                res[f"{a}_vs_{b}"] = dict(
                    max_abs=float(diff[fin].max()) if fin.any() else None,
                    mean_abs=float(diff[fin].mean()) if fin.any() else None,
                    nonfinite=int((~fin).sum()),
                )
            elif a in arrs and b in arrs:
                res[f"{a}_vs_{b}"] = dict(err=f"shapes differ {arrs[a].shape} vs {arrs[b].shape}")
        out.append(res)
    for mode in ("unpatched", "patched", "native"):
        pr, pp = (os.path.join(d, f"logps_{mode}_{u}.npy") for u in ("ref", "policy"))
        if os.path.exists(pr) and os.path.exists(pp):
            a, b = np.load(pr), np.load(pp)
            if a.shape == b.shape:
                out.append(
                    dict(
                        part="B",
                        mode="compare",
                        use="ref_vs_policy",
                        variant=mode,
                        max_abs=float(np.nanmax(np.abs(a.astype(np.float64) - b))) if a.size else None,
                    )
                )
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["unpatched", "patched", "native"])
    ap.add_argument("--save", default="")
    ap.add_argument("--compare")
    a = ap.parse_args()
    if a.compare:
        for r in compare(a.compare):
            emit(r)
        return 0
    try:
        row = child(a.mode, a.save)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        import traceback

        traceback.print_exc(limit=-8, file=sys.stderr)
        row = dict(
            part="B",
            mode=a.mode,
            ok=False,
            err=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"[:300],
        )
    row["seconds"] = round(time.time() - T0, 1)
    emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
