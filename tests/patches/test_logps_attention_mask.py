"""logps-attention-mask: TRL 0.14.0 computes the policy and reference log-probs without the mask.

* The mask builder, on hand-made ids (every cell with torch).
* The status expected for the installed TRL (applied on 0.14.0, "not needed" from 0.15.0 on).
* A real GRPO run (TRL 0.14.0 cells) on prompts of different lengths: every log-prob forward TRL
  makes to the policy and to the reference model is recorded (``logps_capture``) and TRL's
  log-probs are compared, row by row, with those of the same sequence without its left pads.
  Without the patch the padded rows differ (the bug) and the unpadded row agrees; with it every
  row agrees, and logits-to-keep still delivers K+1 logits (both patches applied together).
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat
from trl_compat.patches import logps_attention_mask as lam

from packaging.version import Version

from versions import installed

PID = "logps-attention-mask"

TRL = installed("trl")

BUGGY = TRL is not None and TRL < Version("0.15.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not BUGGY, reason=f"TRL {TRL} passes the attention mask itself (fixed in 0.15.0)")


def test_mask_masks_leading_pads_and_completion_after_first_eos():
    pad, eos = 0, 1
    ids = torch.tensor(
        [
            [0, 0, 7, 8, 9, 1, 0],  # two left pads; completion ends with EOS then a pad
            [5, 6, 7, 8, 9, 10, 11],  # no pad, no EOS
            [0, 0, 0, 0, 9, 9, 1],  # EOS on the last completion token
        ]
    )
    mask = lam.logps_mask(ids, completion_length=3, pad_token_id=pad, eos_token_id=eos)
    assert mask.tolist() == [
        [0, 0, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 1, 1, 1],
        [0, 0, 0, 0, 1, 1, 1],
    ]
    # a pad id inside the prompt (not leading) stays attended; no pad token: nothing masked
    assert lam.logps_mask(torch.tensor([[3, 0, 4, 5]]), 1, pad, eos).tolist() == [[1, 1, 1, 1]]
    assert lam.logps_mask(torch.tensor([[0, 0, 4, 5]]), 1, None, None).tolist() == [[1, 1, 1, 1]]


def _run(tmp_path):
    import grpo_run
    import logps_capture
    import tiny

    trainer = grpo_run.make_trainer(tmp_path, model="qwen2", steps=1, train_dataset=logps_capture.uneven_prompt_dataset())
    calls = logps_capture.LogpsCalls(trainer, pad_token_id=trainer.processing_class.pad_token_id)
    try:
        trainer.train()
    finally:
        calls.remove()
    assert {c.role for c in calls.calls} == {"policy", "ref"}, [c.role for c in calls.calls]
    assert trainer.processing_class.pad_token_id == tiny.make_tokenizer().pad_token_id == 0
    return calls


def _padded_rows(call, pad):
    return (call.ids[:, 0] == pad).tolist()


def _until_first_eos(call, eos=1):
    """Completion positions up to and including the first EOS: the ones the loss uses."""
    is_eos = call.ids[:, -call.k :].eq(eos).long()
    return (is_eos.cumsum(1) - is_eos) == 0


@needs_bug
def test_grpo_logps_are_those_of_the_unpadded_sequences(tmp_path):
    calls = _run(tmp_path)
    for call in calls.calls:
        padded = _padded_rows(call, 0)
        assert any(padded) and not all(padded), call.ids  # prompts of different lengths, left-padded
        # the mask the model received: TRL 0.15.0's, zeros exactly on the leading pads
        assert call.mask is not None
        assert call.mask[:, : call.ids.size(1) - call.k].eq(call.ids[:, : call.ids.size(1) - call.k].ne(0).long()).all()
        valid = _until_first_eos(call)
        assert call.mask[:, -call.k :].eq(valid.long()).all()
        torch.testing.assert_close(calls.trl_logps(call)[valid], call.unpadded[valid], atol=2e-5, rtol=1e-4)
        # logits-to-keep is applied too (this cell's model takes num_logits_to_keep, directly or renamed)
        assert call.rows == call.k + 1
    assert trl_compat.status("logits-to-keep") == trl_compat.APPLIED


@needs_bug
def test_bug_without_the_patch_pads_change_the_logps(tmp_path, unpatched):
    import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module

    with unpatched(PID):
        calls = _run(tmp_path)
    for call in calls.calls:
        assert call.mask is None  # TRL 0.14.0 passes none
        padded = torch.tensor(_padded_rows(call, 0))
        valid = _until_first_eos(call)
        err = ((calls.trl_logps(call) - call.unpadded).abs() * valid).amax(dim=1)
        assert err[padded].min() > 1e-3, err  # every left-padded row is off
        assert err[~padded].max() < 2e-5, err  # the longest prompt (no pads) is right
        torch.testing.assert_close(calls.trl_logps(call), call.masked, atol=2e-5, rtol=1e-4)  # = a mask-free forward
