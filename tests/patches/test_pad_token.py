"""pad-token: GRPO with a tokenizer that has no pad token (GPT-2, Llama-3 base) dies at step 1.

* Status for the installed TRL (applied on 0.14.0 - 0.16.x, "not needed" from 0.17.0 on).
* A real GRPO run (TRL 0.14 - 0.17 cells) with the tiny tokenizer stripped of its pad token, on
  prompts of different lengths. Without the patch (in the window): ``ValueError: Asking to pad but
  the tokenizer does not have a padding token`` at the first step. With it (and on fixed TRL): pad =
  EOS, training runs, and in every log-prob forward TRL makes the prompts are left-padded with EOS
  ids, exactly ``longest - own length`` of them per row (known from the dataset), with the
  attention mask (TRL's, or logps-attention-mask's on 0.14.0) zero on exactly those columns.
* A tokenizer TRL loads itself (``processing_class=None``) gets pad = EOS too, and so does the
  ``pad_token_id`` of TRL's ``GenerationConfig``.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import pad_token as pt

from packaging.version import Version

from versions import installed

PID = "pad-token"
WORDS = (2, 3, 5, 7)

TRL = installed("trl")

BUGGY = TRL is not None and TRL < Version("0.17.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} sets pad = eos itself (fixed in 0.17.0)")
# The runs below read TRL's log-prob calls as TRL 0.14 - 0.17 make them: the window and the first fixed release.
runs_here = pytest.mark.skipif(
    TRL is None or TRL >= Version("0.18"), reason=f"TRL {TRL}: the pad-token runs cover the window and 0.17.0, its first fixed release"
)


def no_pad_tokenizer():
    import tiny

    tokenizer = tiny.make_tokenizer()
    tokenizer.pad_token = None
    assert tokenizer.pad_token is None and tokenizer.pad_token_id is None
    assert tokenizer.eos_token == tiny.EOS and tokenizer.eos_token_id == 1
    return tokenizer


def test_set_pad_token_only_when_missing():
    import tiny

    tokenizer = no_pad_tokenizer()
    assert pt.set_pad_token(tokenizer) is True
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == (tiny.EOS, 1)
    kept = tiny.make_tokenizer()
    assert pt.set_pad_token(kept) is False and kept.pad_token == tiny.PAD
    neither = no_pad_tokenizer()
    neither.eos_token = None
    assert pt.set_pad_token(neither) is False and neither.pad_token is None
    assert pt.set_pad_token(None) is False


def _run(tmp_path, tokenizer):
    import grpo_run
    import logps_capture

    trainer = grpo_run.make_trainer(
        tmp_path, model="qwen2", steps=1, processing_class=tokenizer, train_dataset=logps_capture.uneven_prompt_dataset(WORDS)
    )
    calls = logps_capture.LogpsCalls(trainer, pad_token_id=1)
    try:
        trainer.train()
    finally:
        calls.remove()
    return trainer, calls


@needs_bug
def test_bug_without_the_patch_padding_raises(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    with unpatched(PID):
        with pytest.raises(ValueError, match="Asking to pad but the tokenizer does not have a padding token"):
            _run(tmp_path, no_pad_tokenizer())


@runs_here
def test_grpo_runs_with_eos_as_pad_token(tmp_path):
    import grpo_run
    import tiny

    tokenizer = no_pad_tokenizer()
    trainer, calls = _run(tmp_path, tokenizer)
    assert trainer.processing_class is tokenizer
    assert (tokenizer.pad_token, tokenizer.pad_token_id) == (tiny.EOS, 1)
    if getattr(trainer, "generation_config", None) is not None:  # TRL's own generate path
        assert trainer.generation_config.pad_token_id == 1
    assert grpo_run.finite_losses(trainer.state.log_history), trainer.state.log_history
    assert calls.calls
    for call in calls.calls:
        prompt = call.ids[:, : call.ids.size(1) - call.k]
        leading = (prompt == 1).long().cumprod(dim=1).sum(dim=1)  # the left pads: EOS ids
        lengths = prompt.size(1) - leading
        assert set(lengths.tolist()) <= set(WORDS) and len(set(lengths.tolist())) > 1, prompt
        assert lengths.max().item() == prompt.size(1)  # padded to the longest prompt of the batch
        assert call.mask is not None
        assert call.mask[:, : prompt.size(1)].eq(prompt.ne(1).long()).all(), (call.mask, prompt)


def _trainer_loading_its_tokenizer(tmp_path):
    from trl import GRPOTrainer

    import grpo_run
    import tiny

    path = tiny.save_tiny(tmp_path / "model", "qwen2", tokenizer=no_pad_tokenizer())
    args, _ = grpo_run.make_config(tmp_path / "out")
    return GRPOTrainer(model=path, reward_funcs=[tiny.varying_reward], args=args, train_dataset=tiny.prompt_dataset(4))


@needs_bug
def test_bug_without_the_patch_tokenizer_loaded_by_trl_has_no_pad_token(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    with unpatched(PID):
        trainer = _trainer_loading_its_tokenizer(tmp_path)
    assert trainer.processing_class.pad_token is None
    assert trainer.generation_config.pad_token_id is None


@runs_here
def test_tokenizer_loaded_by_trl_gets_eos_as_pad_token(tmp_path):
    import tiny

    trainer = _trainer_loading_its_tokenizer(tmp_path)
    assert (trainer.processing_class.pad_token, trainer.processing_class.pad_token_id) == (tiny.EOS, 1)
    if getattr(trainer, "generation_config", None) is not None:
        assert trainer.generation_config.pad_token_id == 1
