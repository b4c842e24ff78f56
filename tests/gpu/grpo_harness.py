"""GRPO on CUDA in bf16 for the installed TRL, in one process: one JSON line per variant on stdout.

    python tests/gpu/grpo_harness.py --mode plain|min|shim [--variants safe,full,lora,luspo]

Run by tests/gpu/test_grpo_cuda.py (a process per mode: a patch, once applied, stays for the process).
mode  plain: no trl_compat;  shim: ``import trl_compat`` first (every patch);
      min: trl_compat with only the patches TRL needs to import and build on transformers 5
      (transformers5-*), every other one disabled: the baseline where plain TRL cannot even import.
variants (each caught on its own: a crash never stops the next one), with the triggers of the patches
that compute tensors:
  safe   full model, loss dapo (dapo normalisers), GA 2, steps_per_generation 4, two reward functions
         that return None for the same quarter of completions (none-reward-baseline), scale_rewards
         (scale-rewards-swapped), top_entropy_quantile 0.5 and entropy_coef 0.1 (entropy normaliser),
         beta 0.04, mask_truncated_completions, an EOS list [1, 3] (generation-eos-ids),
         max_prompt_length 6 where it exists, eval every step: the config plain TRL should train.
  full   safe + a functools.partial reward function + metric_for_best_model="eval_reward"
         + trainer.evaluate() before train() (known crashes of some releases).
  lora   full + peft LoraConfig(r=4, q_proj/v_proj), base weights bf16 on CUDA.
  luspo  safe with loss_type="luspo" (luspo-unmasked-loss; only where the release has it).
Each variant also replays its first training loss on the CPU in float32 (the same weights, the same
inputs moved to the CPU): ``replay`` holds both values, so that a fix's value on CUDA in bf16 is held
to its value on the CPU, where its tests run.
TRL_COMPAT_GPU_DRY_RUN=1: the same on the CPU in float32 (a dry run before a GPU is lent).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import tempfile
import time
import traceback
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "support"))  # tiny.py
DRY = os.environ.get("TRL_COMPAT_GPU_DRY_RUN", "") == "1"
MIN_IDS = ("transformers5-import", "transformers5-use-cache", "transformers5-warnings-issued")
T0 = time.time()


def emit(row: dict) -> None:
    print("@@JSON " + json.dumps(row, default=str), flush=True)


def err_info(exc: BaseException) -> dict:
    frames = traceback.extract_tb(exc.__traceback__)

    def short(fr):
        f = fr.filename
        for key in ("/trl_compat/", "/trl/", "/transformers/", "/peft/", "/accelerate/", "/torch/", "/datasets/", "/tests/gpu/"):
            if key in f:
                f = key.strip("/") + "/" + f.split(key, 1)[1]
                break
        else:
            f = os.path.basename(f)
        return f"{f}:{fr.lineno}:{fr.name}"

    msg = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    text = msg[0] if msg else ""
    if len(msg) > 1:  # e.g. TRL's "Failed to import ... (look up to see its traceback):" + the cause
        text += " | " + msg[-1]
    return {
        "err": f"{type(exc).__name__}: {text}"[:400],
        "tb": [short(fr) for fr in frames[-5:]],
        "trl_compat_in_tb": any("/trl_compat/" in fr.filename for fr in frames),
    }


# -- model, data, rewards --------------------------------------------------------------------------


def words_prompts(n: int, offset: int) -> list[str]:
    import tiny

    words = tiny.vocab_words()
    out = []
    for i in range(n):
        k = 3 + (i % 6)  # 3..8 words: some longer than max_prompt_length=6
        out.append(" ".join(words[((i + offset) * 37 + j * 11) % len(words)] for j in range(k)))
    return out


def text_of(c) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        return " ".join(m.get("content", "") for m in c if isinstance(m, dict))
    return str(c)


def scored(prompts, completions, scale: float = 1.0, **kwargs):
    """Varying reward; None (declined) for about a quarter of the completions, the same ones for both funcs."""
    out = []
    for c in completions:
        t = text_of(c)
        if zlib.crc32(t.encode()) % 4 == 1:  # crc32("") == 0: empty completions are scored
            out.append(None)
            continue
        w = t.split()
        s = "".join(w)
        out.append(scale * (s.count("a") + 0.5 * s.count("o") + 0.01 * len(set(w))))
    return out


def scored_half(prompts, completions, **kwargs):
    return scored(prompts, completions, scale=0.5, **kwargs)


_SAVED: dict = {}


def build_model(bf16_base: bool):
    """The tiny Qwen2, saved once to a directory and loaded from it, so that TRL can load the reference
    model (beta > 0) from its name_or_path, as it does for a hub id."""
    import torch
    from transformers import Qwen2ForCausalLM

    import tiny

    if "path" not in _SAVED:
        model = tiny.make_model("qwen2", seed=0)
        with torch.no_grad():  # make EOS (1) and id 3 likely: completions of mixed lengths, some truncated
            model.lm_head.weight[1].mul_(12.0)
            model.lm_head.weight[3].mul_(6.0)
        model.generation_config.eos_token_id = [1, 3]  # an extra end-of-turn id (generation-eos-ids)
        model.generation_config.pad_token_id = 0
        path = tempfile.mkdtemp(prefix="tiny_qwen2_")
        tiny.save_tiny(path, model=model)
        _SAVED["path"] = path
    dtype = torch.bfloat16 if bf16_base else torch.float32
    return Qwen2ForCausalLM.from_pretrained(_SAVED["path"], dtype=dtype)


# -- the CPU replay of one training loss ----------------------------------------------------------


def cpu_copy(model):
    """The model in float32 on the CPU, without the autocast forward accelerate sets on the instance."""
    import copy

    import torch

    clone = copy.deepcopy(model)
    for module in clone.modules():
        for name in ("forward", "_original_forward"):
            module.__dict__.pop(name, None)
    return clone.to("cpu", torch.float32)


def to_cpu(value):
    import torch

    if isinstance(value, torch.Tensor):
        value = value.detach().to("cpu")
        return value.float() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {key: to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(item) for item in value)
    return value


def replay(cls, trainer, snapshot, out, args, kwargs) -> dict:
    """TRL's compute_loss (with every patch that wraps it) again, on the CPU in float32."""
    import torch

    model, inputs = snapshot
    result: dict = {}
    try:
        loss = out[0] if isinstance(out, tuple) else out
        result["device_loss"] = float(loss.detach().float().item())
        result["device"] = str(loss.device)
        result["dtype"] = str(next(p for p in trainer.model.parameters() if p.requires_grad).dtype).replace("torch.", "")
        model.train()
        with torch.no_grad():
            again = cls.compute_loss(trainer, model, inputs, *args, **kwargs)
        again = again[0] if isinstance(again, tuple) else again
        result["cpu_loss"] = float(again.detach().float().item())
        result["abs_diff"] = abs(result["cpu_loss"] - result["device_loss"])
    except Exception as exc:  # noqa: BLE001 - a failed replay is a result
        result.update(err_info(exc))
    return result


# -- one variant -------------------------------------------------------------------------------


def run_variant(stack: str, mode: str, variant: str) -> dict:
    import dataclasses
    import gc

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    import tiny

    row: dict = {"variant": variant, "ok": False, "stage": "setup"}
    fields = {f.name for f in dataclasses.fields(GRPOConfig)}
    loss_help = ""
    for f in dataclasses.fields(GRPOConfig):
        if f.name == "loss_type":
            loss_help = str(f.metadata.get("help", ""))
    if variant == "luspo" and "luspo" not in loss_help:
        row.update(ok=None, skipped="loss_type luspo not in this release")
        return row

    tmp = tempfile.mkdtemp(prefix=f"grpo_{stack}_{mode}_{variant}_")
    want = dict(
        output_dir=tmp,
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        gradient_accumulation_steps=2,
        steps_per_generation=4,
        max_steps=3,
        learning_rate=1e-4,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
        bf16=not DRY,
        loss_type="luspo" if variant == "luspo" else "dapo",
        beta=0.04,
        mask_truncated_completions=True,
        top_entropy_quantile=0.5,
        entropy_coef=0.1,
        max_prompt_length=6,
        eval_strategy="steps",
        eval_steps=1,
        dataloader_num_workers=0,
    )
    if variant in ("full", "lora"):
        want["metric_for_best_model"] = "eval_reward"
    kwargs = {k: v for k, v in want.items() if k in fields}
    row["config_dropped"] = sorted(k for k in want if k not in fields and k != "output_dir")

    rec = {"adv_finite": [], "adv_zero_frac": [], "adv_device": set(), "loss_train": [], "loss_eval": [], "loss_device": set()}
    trainer = None
    try:
        row["stage"] = "config"
        args = GRPOConfig(**kwargs)
        tok = tiny.make_tokenizer()
        model = build_model(bf16_base=(variant == "lora" and not DRY))
        train_ds = Dataset.from_dict({"prompt": words_prompts(16, 0)})
        eval_ds = Dataset.from_dict({"prompt": words_prompts(2, 100)})
        if variant in ("full", "lora"):
            rewards = [scored, functools.partial(scored, scale=0.5)]
        else:
            rewards = [scored, scored_half]
        extra = {}
        if variant == "lora":
            from peft import LoraConfig

            extra["peft_config"] = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
        row["stage"] = "trainer"
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=rewards,
            args=args,
            train_dataset=train_ds,
            eval_dataset=eval_ds,
            processing_class=tok,
            **extra,
        )

        cls = type(trainer)

        def gen_wrap(*a, **k):
            out = cls._generate_and_score_completions(trainer, *a, **k)
            try:
                adv = out.get("advantages") if isinstance(out, dict) else None
                if adv is not None:
                    rec["adv_finite"].append(bool(torch.isfinite(adv).all().item()))
                    rec["adv_zero_frac"].append(round(float((adv == 0).float().mean().item()), 3))
                    rec["adv_device"].add(str(adv.device))
            except Exception as e:  # noqa: BLE001
                rec.setdefault("probe_errors", []).append(repr(e)[:200])
            return out

        def loss_wrap(model_, inputs, *a, **k):
            first = model_.training and "replay" not in row
            if first:  # before the first optimizer step: the weights are those the CPU copy gets
                row["replay"] = {}
                snapshot = (cpu_copy(model_), to_cpu(inputs))
            out = cls.compute_loss(trainer, model_, inputs, *a, **k)
            try:
                loss = out[0] if isinstance(out, tuple) else out
                val = float(loss.detach().float().item())
                (rec["loss_train"] if model_.training else rec["loss_eval"]).append(val)
                rec["loss_device"].add(str(loss.device))
            except Exception as e:  # noqa: BLE001
                rec.setdefault("probe_errors", []).append(repr(e)[:200])
            if first:
                row["replay"] = replay(cls, trainer, snapshot, out, a, k)
            return out

        if hasattr(cls, "_generate_and_score_completions"):
            trainer._generate_and_score_completions = gen_wrap
        trainer.compute_loss = loss_wrap

        if variant in ("full", "lora"):
            row["stage"] = "evaluate_before_train"
            metrics = trainer.evaluate()
            row["eval_before_train"] = {
                k: round(v, 5) if isinstance(v, float) else v for k, v in metrics.items() if "loss" in k or "reward" in k
            }
        row["stage"] = "train"
        out = trainer.train()
        row["stage"] = "done"
        row["ok"] = True
        row["train_loss"] = getattr(out, "training_loss", None)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        row.update(err_info(exc))
        print(f"[{stack}/{mode}/{variant}] {type(exc).__name__} at stage {row['stage']}", file=sys.stderr)
        traceback.print_exc(limit=-8, file=sys.stderr)
    finally:
        if trainer is not None:
            st = trainer.state
            row["steps"] = st.global_step
            hist = st.log_history
            losses = [h["loss"] for h in hist if "loss" in h]
            row["final_loss"] = losses[-1] if losses else None
            row["logged_losses"] = losses
            row["eval_losses"] = [h["eval_loss"] for h in hist if "eval_loss" in h]
            row["eval_rewards"] = [round(h["eval_reward"], 4) for h in hist if "eval_reward" in h]
            keys = ("loss", "kl", "policy_loss", "entropy", "grad_norm", "reward")
            row["step_metrics"] = [
                {k: (round(h[k], 5) if isinstance(h[k], float) else h[k]) for k in keys if k in h} for h in hist if "loss" in h
            ][:4]
            row["trunc_ratio"] = [round(h[k], 3) for h in hist for k in h if k.endswith("clipped_ratio") and not k.startswith("eval")][
                :6
            ]
            try:
                m = trainer.model
                row["param_devices"] = sorted({str(p.device) for p in m.parameters()})
                row["param_dtypes"] = sorted({str(p.dtype).replace("torch.", "") for p in m.parameters()})
                ref = getattr(trainer, "ref_model", None)
                if ref is not None:
                    row["ref_devices"] = sorted({str(p.device) for p in ref.parameters()})
            except Exception as e:  # noqa: BLE001
                row["param_devices"] = f"? {e!r}"[:200]
        else:
            row["steps"] = 0
        fin = lambda xs: all(math.isfinite(x) for x in xs) if xs else None  # noqa: E731
        row["loss_finite"] = fin(rec["loss_train"] + [x for x in row.get("logged_losses", []) if isinstance(x, float)])
        row["eval_loss_finite"] = fin(rec["loss_eval"])
        row["adv_finite"] = all(rec["adv_finite"]) if rec["adv_finite"] else None
        row["adv_zero_frac"] = rec["adv_zero_frac"][:6]
        row["adv_devices"] = sorted(rec["adv_device"])
        row["loss_devices"] = sorted(rec["loss_device"])
        row["n_loss_calls"] = [len(rec["loss_train"]), len(rec["loss_eval"])]
        if "probe_errors" in rec:
            row["probe_errors"] = rec["probe_errors"][:3]
        if not DRY and row.get("param_devices") and isinstance(row["param_devices"], list):
            row["on_cuda"] = all(d.startswith("cuda") for d in row["param_devices"])
        trainer = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def patch_statuses() -> dict:
    tc = sys.modules.get("trl_compat")
    if tc is None:
        return {}
    rows = [r.as_dict() for r in tc.report()]
    return {
        "applied": [r["id"] for r in rows if r["status"] == "applied"],
        "other": {r["id"]: r["status"] for r in rows if r["status"] not in ("applied", "not needed", "disabled")},
        "n_disabled": sum(r["status"] == "disabled" for r in rows),
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", default="local", help="a label for the rows (the runner names the TRL release)")
    ap.add_argument("--mode", choices=["plain", "min", "shim"], required=True)
    ap.add_argument("--variants", default="safe,full,lora,luspo")
    a = ap.parse_args()
    variants = a.variants.split(",")
    base = {"part": "A", "stack": a.stack, "mode": a.mode}

    if a.mode == "min":
        from trl_compat.patches import PATCHES

        os.environ["TRL_COMPAT_DISABLE"] = ",".join(p.id for p in PATCHES if p.id not in MIN_IDS)
    if a.mode in ("min", "shim"):
        import trl_compat  # noqa: F401 - before trl, as a user would

    try:
        import torch
        from trl import GRPOConfig, GRPOTrainer  # noqa: F401 - the import that fails on some stacks
    except BaseException as exc:  # noqa: BLE001
        info = err_info(exc)
        print(f"[{a.stack}/{a.mode}] import failed: {info['err']}", file=sys.stderr)
        traceback.print_exc(limit=-6, file=sys.stderr)
        for v in variants:
            emit(dict(base, variant=v, ok=False, stage="import", steps=0, **info, patches=patch_statuses()))
        return 0

    import importlib.metadata as md

    def ver(d):
        try:
            return md.version(d)
        except Exception:  # noqa: BLE001
            return None

    versions = {d: ver(d) for d in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "trl_compat", "huggingface_hub")}
    cuda = torch.cuda.is_available()
    dev = torch.cuda.get_device_name(0) if cuda else "cpu"
    print(f"[{a.stack}/{a.mode}] imports {time.time() - T0:.1f}s; {versions}; device {dev}", file=sys.stderr)
    for v in variants:
        t = time.time()
        try:
            row = run_variant(a.stack, a.mode, v)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            row = dict(variant=v, ok=False, stage="harness", **err_info(exc))
        row = dict(base, **row)
        row["seconds"] = round(time.time() - t, 1)
        row["patches"] = patch_statuses()
        row["versions"] = versions
        row["device"] = dev
        row["dryrun"] = DRY
        if a.mode == "plain":
            row["trl_compat_loaded"] = "trl_compat" in sys.modules
        emit(row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
