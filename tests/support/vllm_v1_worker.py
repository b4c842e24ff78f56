"""TRL 0.14/0.15's real in-process vLLM engine on a real vLLM >= 0.8, for tests/patches/test_vllm_v1_engine.py.

Run as ``python tests/support/vllm_v1_worker.py OUT_DIR`` in a fresh process without ``VLLM_USE_V1`` (the
test removes it); ``TRL_COMPAT_DISABLE=vllm-v1-engine`` runs it unpatched. It builds a GRPOTrainer
with ``use_vllm=True`` on a tiny Qwen2 (CPU: ``vllm_device="cpu"``; GPU: TRL's ``"auto"``), notes
``VLLM_USE_V1`` at the moment TRL calls ``LLM(...)`` and the engine class vLLM built, checks vLLM
holds the checkpoint's weights, changes the training weights, runs TRL's real ``_move_model_to_vllm``
and prints one line ``V1|{json}``: the patch's status, what was seen, the sync's error (if any) and
whether vLLM then holds the changed weights.
"""

import json
import os
import sys

# head_dim 64: vLLM's attention backends do not all take the tiny fixtures' 32
SHAPE = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)


def main():
    out_dir = sys.argv[1]
    import trl_compat  # before trl, as a user would

    import torch
    import trl.trainer.grpo_trainer as grpo

    import grpo_run
    import tiny

    record = {p.id: p for p in trl_compat.report()}["vllm-v1-engine"]
    out = {"status": record.status, "reason": record.reason, "env_at_construction": []}
    if record.status not in (trl_compat.APPLIED, trl_compat.DISABLED):
        print("V1|" + json.dumps(out), flush=True)
        return

    seen = out["env_at_construction"]
    real_llm = grpo.LLM

    class ObservedLLM(real_llm):
        def __init__(self, *args, **kwargs):
            seen.append(os.environ.get("VLLM_USE_V1"))
            super().__init__(*args, **kwargs)

    grpo.LLM = ObservedLLM
    path = tiny.save_tiny(os.path.join(out_dir, "tiny"), model=tiny.make_model("qwen2", **SHAPE))
    device = "auto" if torch.cuda.is_available() else "cpu"
    overrides = dict(vllm_device=device, vllm_max_model_len=128, vllm_gpu_memory_utilization=0.3)
    args, _ = grpo_run.make_config(os.path.join(out_dir, "out"), use_vllm=True, **overrides)
    from trl import GRPOTrainer

    trainer = GRPOTrainer(
        model=path,
        reward_funcs=[tiny.varying_reward],
        args=args,
        train_dataset=tiny.prompt_dataset(8),
        processing_class=tiny.make_tokenizer(),
    )
    engine = trainer.llm.llm_engine
    out["engine"] = f"{type(engine).__module__}.{type(engine).__qualname__}"

    def vllm_embed():
        llm_model = engine.model_executor.driver_worker.model_runner.model
        return llm_model.model.embed_tokens.weight[: tiny.VOCAB_SIZE].detach().float().cpu().clone()

    trained = trainer.model.get_input_embeddings().weight
    initial = trained.detach().float().cpu().clone()
    try:
        out["vllm_held_initial"] = bool(torch.allclose(vllm_embed(), initial, atol=1e-3))
    except AttributeError as exc:
        out["vllm_held_initial"] = f"{type(exc).__name__}: {exc}"
    with torch.no_grad():
        trained.add_(0.25)  # what an optimizer step would do, made large and exact
    try:
        trainer._move_model_to_vllm()
        out["sync_error"] = None
        out["vllm_holds_trained"] = bool(torch.allclose(vllm_embed(), trained.detach().float().cpu(), atol=1e-3))
    except AttributeError as exc:
        out["sync_error"] = f"{type(exc).__name__}: {exc}"
    print("V1|" + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # vLLM's engine threads can hang the interpreter's teardown
