"""dapo-masked-token-normalizer: the dapo normaliser counted tokens the loss masks out (TRL 0.22.0 - 1.8.0).

* Real tiny GRPO runs (``loss_type="dapo"``, ``mask_truncated_completions=True``, one step of 4
  completions, ``steps_per_generation = gradient_accumulation_steps = 1``) whose completions are
  fixed (``fixed_completions``): two end in EOS after 3 tokens, two are truncated at 8 tokens.
* Hand-counted from the completion ids: the loss sums 3 + 3 = 6 tokens; all completions hold
  3 + 8 + 3 + 8 = 22.
* Without the patch (0.22.0 - 1.8.0): ``num_items_in_batch`` is 22, and the loss of the step with
  every advantage set to 1 (each token's loss is -1 at the first step: ratio exp(0)) is -6/22.
  With it (and on TRL >= 1.9.0, where the patch is "not needed"): 6 and -1.0, the token mean.
  Without masking (``mask_truncated_completions=False``) the count stays 22 either way.
* The probe on the cell's TRL and on code written here.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trl_compat.patches import dapo_masked_token_normalizer as dmt

from packaging.version import Version

from versions import installed

PID = "dapo-masked-token-normalizer"
TRL = installed("trl")
ALL_TOKENS = 3 + 8 + 3 + 8
LOSS_TOKENS = 3 + 3

needs_trl = pytest.mark.skipif(TRL is None or TRL < Version("0.22.0"), reason=f"TRL {TRL}: before num_items_in_batch")
needs_bug = pytest.mark.skipif(
    TRL is None or not (Version("0.22.0") <= TRL < Version("1.9.0")), reason=f"TRL {TRL} is outside 0.22.0 - 1.8.0"
)


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401 - the trigger module: the patch is applied before a test reverts it


def _run(tmp_path, mask_truncated=True):
    """One training step on fixed completions; per loss call: (num_items_in_batch, hand counts, unit-advantage loss)."""
    import fixed_completions
    import grpo_run

    trainer = grpo_run.make_trainer(
        tmp_path,
        steps=1,
        loss_type="dapo",
        mask_truncated_completions=mask_truncated,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
    )
    fixed_completions.install(trainer)
    eos = trainer.processing_class.eos_token_id
    seen = []
    method = trainer.compute_loss

    def spy(model, inputs, *args, **kwargs):
        ids = inputs["completion_ids"]
        with torch.no_grad():
            unit = method(model, dict(inputs, advantages=torch.ones_like(inputs["advantages"])), *args, **kwargs)
        seen.append(
            dict(
                num_items=float(inputs["num_items_in_batch"]),
                all_tokens=fixed_completions.tokens_to_eos(ids, eos),
                loss_tokens=fixed_completions.tokens_of_eos_rows(ids, eos),
                unit_loss=float(unit),
            )
        )
        return method(model, inputs, *args, **kwargs)

    trainer.compute_loss = spy
    trainer.train()
    assert len(seen) == 1, seen
    return seen[0]


def test_the_hand_counts_differ():
    assert LOSS_TOKENS != ALL_TOKENS


@needs_bug
def test_bug_without_the_patch_the_normaliser_counts_masked_tokens(tmp_path, unpatched):
    with unpatched(PID):
        step = _run(tmp_path)
    assert (step["all_tokens"], step["loss_tokens"]) == (ALL_TOKENS, LOSS_TOKENS)
    assert step["num_items"] == ALL_TOKENS
    assert step["unit_loss"] == pytest.approx(-LOSS_TOKENS / ALL_TOKENS, rel=1e-6)


@needs_trl
def test_the_normaliser_counts_the_loss_tokens(tmp_path):
    step = _run(tmp_path)
    assert (step["all_tokens"], step["loss_tokens"]) == (ALL_TOKENS, LOSS_TOKENS)
    assert step["num_items"] == LOSS_TOKENS
    assert step["unit_loss"] == pytest.approx(-1.0, rel=1e-6)


@needs_trl
def test_nothing_masked_nothing_changed(tmp_path):
    step = _run(tmp_path, mask_truncated=False)
    assert step["num_items"] == ALL_TOKENS
    assert step["unit_loss"] == pytest.approx(-1.0, rel=1e-6)


@needs_trl
def test_probe_on_the_cells_trl():
    import trl.trainer.grpo_trainer as module

    verdict = dmt.probe(module)
    if TRL < Version("1.9.0"):
        assert verdict.needed is True, verdict
    else:
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict


# -- the probe on code written here: the shapes of TRL 0.22 - 0.23, 0.24 - 1.8 and 1.9 -------------------


class _Counted022:
    def _generate_and_score_completions(self, agg_completion_lengths, completion_mask, truncated):
        num_items_in_batch = agg_completion_lengths.sum()
        if self.mask_truncated_completions:
            completion_mask = completion_mask * truncated
        return {"completion_mask": completion_mask, "num_items_in_batch": num_items_in_batch}


class _Counted024:
    def _generate(self, agg_completion_lengths):
        total_completion_tokens = agg_completion_lengths.sum()
        return total_completion_tokens

    def _generate_and_score_completions(self, completion_mask, truncated):
        num_items_in_batch = self._generate()
        if self.mask_truncated_completions:
            completion_mask = completion_mask * truncated
        return {"completion_mask": completion_mask, "num_items_in_batch": num_items_in_batch}


class _Fixed:
    def _generate_and_score_completions(self, completion_mask, tool_mask, truncated):
        if self.mask_truncated_completions:
            completion_mask = completion_mask * truncated
        loss_mask = completion_mask if tool_mask is None else completion_mask * tool_mask
        num_items_in_batch = self.accelerator.gather(loss_mask.sum()).sum()
        return {"completion_mask": completion_mask, "num_items_in_batch": num_items_in_batch}


class _OtherCount(_Counted024):
    def _generate(self, completion_mask):
        return completion_mask.sum()


class _NoGenerate:
    pass


def _module(cls):
    return type("M", (), {"GRPOTrainer": cls})


@pytest.mark.parametrize(
    "cls, needed", [(_Counted022, True), (_Counted024, True), (_Fixed, False), (_OtherCount, None), (_NoGenerate, None)]
)
def test_probe_on_written_code(cls, needed):
    assert dmt.probe(_module(cls)).needed is needed


def test_the_recount_uses_the_tool_mask_and_keeps_at_least_one():
    class Accelerator:
        @staticmethod
        def gather(tensor):
            return torch.stack([tensor, tensor])  # two processes holding the same rows

    trainer = type("T", (), {"accelerator": Accelerator()})()
    completion_mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    tool_mask = torch.tensor([[1, 0, 1, 1], [1, 1, 0, 0]])
    assert dmt.loss_token_count(trainer, {"completion_mask": completion_mask}).item() == 2 * 7
    assert dmt.loss_token_count(trainer, {"completion_mask": completion_mask, "tool_mask": tool_mask}).item() == 2 * 4
    assert dmt.loss_token_count(trainer, {"completion_mask": torch.zeros(2, 4, dtype=torch.long)}).item() == 1
