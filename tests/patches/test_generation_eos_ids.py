"""generation-eos-ids: without vLLM, TRL < 1.14.2 ends a completion only at the tokenizer's EOS.

* The probe on the real TRL of the cell and on code written here.
* Real GRPO runs without vLLM on a tiny checkpoint whose ``generation_config.eos_token_id`` declares
  the tokenizer's ``</s>`` and 128 end-of-turn ids (a quarter of the vocabulary, so that the random
  model samples one within a few tokens). What the loss gets (``completion_ids`` /
  ``completion_mask`` of ``_generate_and_score_completions``) is recorded. With the patch reverted
  (cells in the window), tokens after an end-of-turn id are in the mask; with it, every
  completion's mask ends at its first end-of-turn id and TRL's generation config stops at them.
"""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import trl_compat
from trl_compat.patches import generation_eos_ids as gei

from packaging.version import Version

from versions import installed

PID = "generation-eos-ids"
TRL = installed("trl")
IN_WINDOW = TRL is not None and Version("0.24.0") <= TRL < Version("1.14.2")
END_OF_TURN = list(range(3, 131))  # plain words of tiny's vocabulary, declared as end-of-turn ids
needs_trl = pytest.mark.skipif(TRL is None, reason="trl is not installed")
needs_bug = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL}: outside the bug's window")


@pytest.fixture(autouse=True)
def _trigger():
    if TRL is not None:
        import trl.trainer.grpo_trainer  # noqa: F401


@needs_trl
def test_status_and_probe_on_the_real_trl():
    from trl.trainer import grpo_trainer

    status = {r.id: r for r in trl_compat.report()}[PID]
    verdict = gei.probe(grpo_trainer)
    if IN_WINDOW:
        assert status.status == trl_compat.APPLIED, status
        assert verdict.needed is True and "only at the tokenizer's EOS" in verdict.reason, verdict
    else:
        assert status.status == trl_compat.NOT_NEEDED, status


class _Buggy:
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
        completion_ids = prompt_ids
        is_eos = completion_ids == self._tokenizer.eos_token_id  # noqa: F841
        logprobs = None
        return completion_ids, logprobs


class _Fixed:
    def _generate_single_turn(self, prompt_ids, images, multimodal_fields):
        completion_ids = prompt_ids
        is_eos = torch.isin(completion_ids, torch.tensor(self.eos_token_ids))  # noqa: F841
        return completion_ids, None


class _OtherReturn:
    def _generate_single_turn(self, prompt_ids):
        completion_ids = prompt_ids
        is_eos = completion_ids == self.eos_token_id  # noqa: F841
        return {"ids": completion_ids}


@pytest.mark.parametrize(
    "cls, needed, snippet",
    [
        (_Buggy, True, "only at the tokenizer's EOS"),
        (_Fixed, False, "(TRL 1.14.2)"),
        (_OtherReturn, None, "the way this patch expects"),
    ],
)
def test_probe_on_code_written_here(cls, needed, snippet):
    import types

    verdict = gei.probe(types.SimpleNamespace(GRPOTrainer=cls))
    assert verdict.needed is needed and snippet in verdict.reason, verdict


def test_cut_ends_each_completion_at_its_first_declared_id():
    assert gei._cut([[5, 7, 200, 7, 9], [300, 301], [9, 1, 7]], frozenset({1, 7})) == [[5, 7], [300, 301], [9, 1]]


# -- real GRPO runs -------------------------------------------------------------------------------


def _run(tmp_path):
    import grpo_run
    import tiny

    model = tiny.make_model()
    model.generation_config.eos_token_id = [1, *END_OF_TURN]
    path = tiny.save_tiny(tmp_path / "checkpoint", model=model)
    trainer = grpo_run.make_trainer(tmp_path, model=path, steps=2)
    seen = []
    original = trainer._generate_and_score_completions

    def spy(*args, **kwargs):
        out = original(*args, **kwargs)
        seen.append((out["completion_ids"].clone(), out["completion_mask"].clone()))
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert seen, "TRL never generated"
    return trainer, seen


def _first_end(row) -> int | None:
    ends = [i for i, token in enumerate(row.tolist()) if token == 1 or token in END_OF_TURN]
    return ends[0] if ends else None


@needs_bug
def test_without_the_patch_tokens_after_the_end_of_turn_are_trained_on(tmp_path, unpatched):
    with unpatched(PID):
        trainer, seen = _run(tmp_path)
    assert trainer.generation_config.eos_token_id == 1  # the tokenizer's only
    scored_after_end = 0
    for ids, mask in seen:
        for row, row_mask in zip(ids, mask):
            end = _first_end(row)
            if end is not None and row_mask[end + 1 :].sum() > 0:
                scored_after_end += 1
    assert scored_after_end > 0  # the bug: completion tokens after an end-of-turn id are in the loss's mask


@needs_bug
def test_with_the_patch_the_completion_ends_at_the_first_end_of_turn(tmp_path):
    assert trl_compat.status(PID) == trl_compat.APPLIED
    trainer, seen = _run(tmp_path)
    assert trainer.generation_config.eos_token_id == [1, *END_OF_TURN]
    ended_early = 0
    for ids, mask in seen:
        for row, row_mask in zip(ids, mask):
            end = _first_end(row)
            if end is None:
                assert row_mask.sum() == row_mask.numel()
                continue
            assert row_mask[: end + 1].tolist() == [1] * (end + 1), (row, row_mask)
            assert row_mask[end + 1 :].sum() == 0, (row, row_mask)
            ended_early += end + 1 < row_mask.numel()
    assert ended_early > 0  # some completion ended before max_completion_length at an end-of-turn id
