"""peft-gradient-checkpointing: LoRA + reentrant gradient checkpointing dies at the first backward.

* Status for the installed TRL (applied on 0.14.0 - 0.15.x with peft, "not needed" from 0.16.0 on).
* A real GRPO run with LoRA and ``gradient_checkpointing=True`` (TRL 0.14 / 0.15 cells with peft):
  without the patch the first backward raises ``element 0 of tensors does not require grad``;
  with it the first backward reaches the LoRA weights (non-zero ``.grad`` on every ``lora_B``,
  recorded by tensor hooks during that backward), the loss is finite and the adapters change.
* ``use_reentrant=False`` is left alone (no input-grad hook), as TRL 0.16 does.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from packaging.version import Version

from versions import installed

PID = "peft-gradient-checkpointing"

TRL = installed("trl")

BUGGY = TRL is not None and TRL < Version("0.16.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} enables input grads itself (fixed in 0.16.0)")


def _run(tmp_path):
    import grpo_run

    trainer = grpo_run.make_trainer(tmp_path, model="qwen2", peft=True, steps=1, gradient_checkpointing=True)
    first_grads = {}
    handles = []
    for name, param in trainer.model.named_parameters():
        if param.requires_grad:

            def keep(grad, name=name):
                first_grads.setdefault(name, grad.detach().abs().sum().item())

            handles.append(param.register_hook(keep))
    before = grpo_run.trainable_snapshot(trainer)
    try:
        trainer.train()
    finally:
        for handle in handles:
            handle.remove()
    return trainer, first_grads, before


@needs_bug
def test_bug_without_the_patch_first_backward_raises(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    with unpatched(PID):
        with pytest.raises(RuntimeError, match="does not require grad and does not have a grad_fn"):
            _run(tmp_path)


@needs_bug
def test_first_backward_reaches_the_lora_weights(tmp_path):
    import grpo_run

    trainer, first_grads, before = _run(tmp_path)
    lora_b = [n for n in before if "lora_B" in n]
    assert lora_b and all(n in first_grads for n in lora_b), sorted(first_grads)
    assert all(first_grads[n] > 0 for n in lora_b), {n: first_grads[n] for n in lora_b}
    assert trainer.args.gradient_checkpointing and trainer.model.is_gradient_checkpointing
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert set(grpo_run.changed_trainable(trainer, before)) >= set(lora_b)


@needs_bug
def test_non_reentrant_checkpointing_is_left_alone(tmp_path):
    import grpo_run

    reentrant = grpo_run.make_trainer(tmp_path / "r", model="qwen2", peft=True, gradient_checkpointing=True)
    assert reentrant.model.get_base_model()._require_grads_hook is not None
    plain = grpo_run.make_trainer(
        tmp_path / "n", model="qwen2", peft=True, gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    assert getattr(plain.model.get_base_model(), "_require_grads_hook", None) is None
