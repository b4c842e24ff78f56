"""vlm-mm-token-type-ids: a VLM processor's ``mm_token_type_ids`` on TRL 0.24 - 0.29.0 (PR #5176, 0.29.0;
PR #5178, fixed in 0.29.1).

* Every cell with TRL: the probe on the real TRL code ("needed" exactly on 0.24.0 - 0.29.0; the gate adds
  transformers 5).
* Stack-free parts (torch only): the widening over the completion, the forward pre-hook that hands each
  chunk its rows, the recording processor class.
* Real GRPO steps on the tiny Qwen2-VL of ``tests/support/tiny_vlm.py`` (nothing from the Hub), its
  processor asked for ``mm_token_type_ids`` (transformers >= 5.3's default); below transformers 5.3 its
  model is the subclass that takes them (``tiny_vlm.model_class``), so that ``generate`` accepts the
  processor's output as it does where the model reads them. A forward pre-hook records what each of TRL's
  log-prob forwards (``use_cache=False``) is handed.
  - trl0.28.0-tf5.2.0, without the patch: old log-probs (``num_iterations=2``) raise TRL's ``TypeError``;
    with aligned steps the step trains, but the loss's forward gets no ``mm_token_type_ids`` while the
    generation's did.
  - same cell, patched, with and without old log-probs: every log-prob forward gets them, ids-shaped,
    1 exactly at the prompt's image tokens (4 a prompt) and 0 over the completion; the batch carries them.
  - trl0.29.1-tf5.2.0 ("not needed"): TRL's own handling gives the same values.
  On TRL 0.29.0 (no cell) with transformers >= 5.3's Qwen2-VL, which reads them, the same run without the
  patch raises the model's ``IndexError: The shape of the mask [22] at index 0 does not match the shape of
  the indexed tensor [14]``; the probe tests hold 0.29.0's code shape.
"""

from __future__ import annotations

import importlib.util

import trl_compat

import pytest
from packaging.version import Version

from cells import only_in_cells
from versions import installed

PATCH_ID = "vlm-mm-token-type-ids"
TRL = installed("trl")
TRANSFORMERS = installed("transformers")
HAVE_TORCH = importlib.util.find_spec("torch") is not None
IN_TRL_WINDOW = TRL is not None and Version("0.24.0") <= TRL < Version("0.29.1")
TRANSFORMERS5 = TRANSFORMERS is not None and TRANSFORMERS >= Version("5.0.0")

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")
vlm_step = only_in_cells("trl0.28.0-tf5.2.0", why="tiny VLM GRPO steps, by value")
vlm_step_fixed = only_in_cells("trl0.29.1-tf5.2.0", why="tiny VLM GRPO steps on the release that fixed it")


# -- the probe ------------------------------------------------------------------------------------------

LOGPS = (
    "    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, batch_size=None,\n"
    "            pixel_values=None, image_grid_thw=None, num_images=None, token_type_ids=None{takes}):\n"
    "        return model(input_ids=input_ids)\n\n"
)
SCORE = (
    "    def _generate_and_score_completions(self, inputs):\n"
    "        prompt_inputs = self.processing_class(images=images, text=prompts_text, padding=True)\n"
    '        forward_kwargs = {{k: v for k, v in prompt_inputs.items() if k not in ["input_ids", "attention_mask"]}}\n'
    "{extend}"
    "        old = self._get_per_token_logps_and_entropies(self.model, ids, mask, keep, {handed})\n"
    "        return {{}}\n\n"
)
LOSS = (
    "    def _compute_loss(self, model, inputs):\n"
    "        return self._get_per_token_logps_and_entropies(model, ids, mask, keep,\n"
    '            {loss}token_type_ids=inputs.get("token_type_ids"){passes})\n'
)
EXTEND = (
    '        if "mm_token_type_ids" in forward_kwargs:\n'
    '            mm_token_type_ids = forward_kwargs["mm_token_type_ids"]\n'
    '            forward_kwargs["mm_token_type_ids"] = torch.cat([mm_token_type_ids, mm_token_type_ids.new_zeros(c.shape)], dim=1)\n'
)
BY_NAME = 'image_grid_thw=inputs.get("image_grid_thw"), '
PASSES = ', mm_token_type_ids=inputs.get("mm_token_type_ids")'


def _trainer_source(takes="", extend="", handed="**forward_kwargs", loss=BY_NAME, passes=""):
    return (
        "class GRPOTrainer:\n"
        + LOGPS.format(takes=takes)
        + SCORE.format(extend=extend, handed=handed)
        + LOSS.format(loss=loss, passes=passes)
    )


@pytest.mark.parametrize(
    "source, verdict, says",
    [
        (_trainer_source(), True, "TypeError"),  # 0.24.0 - 0.28.x
        (_trainer_source(takes=", mm_token_type_ids=None"), True, "IndexError"),  # 0.29.0 (PR #5176)
        (_trainer_source(takes=", mm_token_type_ids=None", extend=EXTEND, passes=PASSES), False, "PR #5178"),  # 0.29.1, 1.x
        (_trainer_source(handed='pixel_values=prompt_inputs.get("pixel_values")'), False, "TRL < 0.24"),  # 0.20 - 0.23
        (_trainer_source(takes=", mm_token_type_ids=None", extend=EXTEND), None, "does not pass them"),
        (_trainer_source(loss=""), None, "does not know"),
    ],
    ids=["0.28", "0.29.0", "0.29.1", "0.23", "extended-only", "other-loss"],
)
def test_probe_on_written_code(code_module, source, verdict, says):
    from trl_compat.patches import vlm_mm_token_type_ids as patch

    result = patch.probe(code_module(source))
    assert result.needed is verdict and says in result.reason, result


@pytest.mark.skipif(TRL is None, reason="needs trl")
def test_probe_on_the_installed_trl():
    from trl_compat.patches import vlm_mm_token_type_ids as patch

    from trl.trainer import grpo_trainer

    result = patch.probe(grpo_trainer)
    assert result.needed is IN_TRL_WINDOW, result


# -- the parts, without TRL ------------------------------------------------------------------------------


@needs_torch
def test_widened_over_the_completion():
    from trl_compat.patches.vlm_mm_token_type_ids import widened

    import torch

    prompt = torch.tensor([[0, 1, 1, 0], [1, 1, 0, 0]])
    assert torch.equal(widened(prompt, 2, 7, 3, "cpu"), torch.tensor([[0, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0]]))
    full = torch.ones(2, 7, dtype=torch.long)
    assert widened(full, 2, 7, 3, "cpu") is full  # already ids-shaped (the loss's)
    assert torch.equal(widened([[1, 0], [0, 1]], 2, 3, 1, "cpu"), torch.tensor([[1, 0, 0], [0, 1, 0]]))  # a processor's lists
    assert widened(prompt, 3, 7, 3, "cpu") is None  # other rows
    assert widened(prompt, 2, 8, 3, "cpu") is None  # neither the ids' width nor the prompt's
    assert widened(prompt[0], 1, 7, 3, "cpu") is None


@needs_torch
def test_each_forward_gets_its_chunks_rows():
    from trl_compat._helpers.logps_calls import hooked
    from trl_compat.patches.vlm_mm_token_type_ids import _feeding

    import torch

    class Model(torch.nn.Module):
        def forward(self, input_ids, mm_token_type_ids=None):
            return mm_token_type_ids

    model, mm = Model(), torch.arange(10).view(5, 2)
    ids = torch.zeros(5, 2, dtype=torch.long)
    with hooked([model], pre=_feeding(mm)):
        got = [model(input_ids=ids[start : start + 2]) for start in range(0, 5, 2)]  # TRL's chunks, in order
        own = model(input_ids=ids[:1], mm_token_type_ids=torch.full((1, 2), 7))
    assert [g.tolist() for g in got] == [[[0, 1], [2, 3]], [[4, 5], [6, 7]], [[8, 9]]]
    assert own.tolist() == [[7, 7]]  # a call that has them keeps its own
    assert model(input_ids=ids[:1]) is None  # the hook is gone after the call


def test_the_processor_records_during_a_batch_only():
    from trl_compat.patches.vlm_mm_token_type_ids import batch as batch_side

    class Processor:
        def __call__(self, images=None, text=None):
            out = {"input_ids": [[5, 7]], "mm_token_type_ids": [[0, 1]]}
            return {**out, "pixel_values": [[0.0]]} if images is not None else out

    processor = Processor()
    recording = batch_side.recording(Processor)
    assert recording is batch_side.recording(Processor) and recording.__name__ == "Processor"
    assert batch_side._swap_class(processor, recording)
    batch = batch_side._Batch(trainer=None)
    token = batch_side._BATCH.set(batch)
    try:
        processor(images=["img"], text=["t"])
        processor(text=["t"])  # no image processed: not the one the forwards need
    finally:
        batch_side._BATCH.reset(token)
    processor(images=["img"], text=["t"])  # outside a batch: nothing noted
    processor.__class__ = Processor
    assert batch.made == [[[0, 1]]]


# -- real GRPO steps ---------------------------------------------------------------------------------------


def _trl_or_skip():
    if not HAVE_TORCH or TRL is None:
        pytest.skip("needs torch and trl")
    import trl.trainer.grpo_trainer  # noqa: F401  (the patch's trigger)


def _window_or_skip():
    _trl_or_skip()
    if not (IN_TRL_WINDOW and TRANSFORMERS5):
        pytest.skip(f"TRL 0.24.0 - 0.29.0 on transformers 5 only (here trl {TRL}, transformers {TRANSFORMERS})")
    # in these cells the patch must be on: a switched-off patch fails here, it does not skip
    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()


def _logps_forwards(model):
    """(input_ids, mm_token_type_ids or None, grad enabled) of each of TRL's log-prob forwards
    (``use_cache=False``), and the ``mm_token_type_ids`` of each generation forward."""
    import torch

    logps, generation = [], []

    def pre(_module, _args, kwargs):
        mm = kwargs.get("mm_token_type_ids")
        mm = None if mm is None else mm.detach().clone()
        if kwargs.get("use_cache") is False:
            logps.append((kwargs["input_ids"].detach().clone(), mm, torch.is_grad_enabled()))
        elif mm is not None:
            generation.append(mm)

    model.register_forward_pre_hook(pre, with_kwargs=True)
    return logps, generation


def _run(tmp_path, num_iterations):
    import grpo_run
    import tiny_vlm

    trainer = tiny_vlm.make_trainer(
        tmp_path,
        model=tiny_vlm.make_model(takes_mm_token_type_ids=True),
        processor=tiny_vlm.make_processor(mm_token_type_ids=True),
        steps=1,
        num_iterations=num_iterations,  # 2: the old log-probs are computed after generation
    )
    logps, generation = _logps_forwards(trainer.model)
    batches = grpo_run.spy_scored_batches(trainer)
    trainer.train()
    assert trainer.state.global_step == 1 and grpo_run.finite_losses(trainer.state.log_history)
    return batches, logps, generation


def _assert_every_logps_forward_gets_them(batches, logps, grads):
    import torch

    import tiny_vlm

    assert len(batches) == 1 and [grad for *_, grad in logps] == grads
    prompt, completion = batches[0]["prompt_ids"].shape[1], batches[0]["completion_ids"].shape[1]
    image_pad = tiny_vlm.token_id(tiny_vlm.IMAGE_PAD)
    for ids, mm, _ in logps:
        assert mm is not None and mm.shape == ids.shape == (4, prompt + completion)
        expected = torch.zeros_like(ids)
        expected[:, :prompt] = (ids[:, :prompt] == image_pad).long()
        assert torch.equal(mm.long(), expected)
        assert mm[:, :prompt].sum(dim=1).tolist() == [4, 4, 4, 4]  # one 16 x 16 image: 4 tokens a prompt
    batch = batches[0]  # the batch carries them, row for row with its ids
    expected = torch.zeros_like(torch.cat([batch["prompt_ids"], batch["completion_ids"]], dim=1))
    expected[:, :prompt] = (batch["prompt_ids"] == image_pad).long()
    assert torch.equal(batch["mm_token_type_ids"].long(), expected)


@vlm_step
def test_bug_old_logps_reject_them(tmp_path, unpatched):
    _window_or_skip()
    if TRL >= Version("0.29.0"):
        pytest.skip("0.29.0 takes them (PR #5176); the model's IndexError needs transformers >= 5.3's Qwen2-VL")
    with unpatched(PATCH_ID):
        with pytest.raises(
            TypeError, match=r"_get_per_token_logps_and_entropies\(\) got an unexpected keyword argument 'mm_token_type_ids'"
        ):
            _run(tmp_path, num_iterations=2)


@vlm_step
def test_bug_the_loss_forward_gets_none(tmp_path, unpatched):
    import torch

    _window_or_skip()
    with unpatched(PATCH_ID):
        batches, logps, generation = _run(tmp_path, num_iterations=1)
    assert generation and all(torch.equal(mm.sum(dim=1), torch.full((4,), 4)) for mm in generation[:1])  # the processor's
    assert [(mm, grad) for _, mm, grad in logps] == [(None, True)]  # the loss's forward: without them
    assert "mm_token_type_ids" not in batches[0]


@vlm_step
@pytest.mark.parametrize("num_iterations, grads", [(1, [True]), (2, [False, True])], ids=["loss-only", "old-logps"])
def test_patched_every_logps_forward_gets_them(tmp_path, num_iterations, grads):
    _window_or_skip()
    batches, logps, _ = _run(tmp_path, num_iterations)
    _assert_every_logps_forward_gets_them(batches, logps, grads)


@vlm_step_fixed
def test_fixed_upstream_hands_them_the_same(tmp_path):
    _trl_or_skip()
    if TRL < Version("0.29.1") or not TRANSFORMERS5:
        pytest.skip("TRL >= 0.29.1 on transformers 5: TRL's own handling (PR #5178)")
    assert trl_compat.status(PATCH_ID) == trl_compat.NOT_NEEDED, trl_compat.report()
    batches, logps, _ = _run(tmp_path, num_iterations=2)
    _assert_every_logps_forward_gets_them(batches, logps, [False, True])
