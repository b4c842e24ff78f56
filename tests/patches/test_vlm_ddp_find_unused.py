"""vlm-ddp-find-unused: a VLM under DDP looks for unused parameters, so a text-only batch (the vision
tower without gradients) trains (TRL 0.20 - 1.15).

In-process: the probe on the installed TRL and on code written here; real trainers of the tiny Qwen2-VL
(tests/support/tiny_vlm.py) and of the tiny Qwen2: ``args.ddp_find_unused_parameters`` after
``GRPOTrainer.__init__`` (True for a VLM, and in the accelerator's DDP handler where transformers made it
in ``__init__``; None for a text model; the user's value kept; None with reentrant checkpointing, which
TRL 0.22 - 1.15 bring back on transformers 4 after each generation whatever was asked). Two
processes (tests/support/vlm_ddp_worker.py under ``torch.distributed.run``, gloo): GRPO of the tiny VLM on
a text-only dataset with the release's default gradient checkpointing, first with the patch reverted (DDP's
error by value at the second step), then with it (two steps, the ranks' weights equal), in one launch
(about 80 s on 2 cores, one cell).
"""

import math
import textwrap

import pytest
from packaging.version import Version

import written_code
from cells import only_in_cells
from unpatched import without_patch
from versions import installed
from workers import launch_two

PATCH_ID = "vlm-ddp-find-unused"
TRL = installed("trl")
TF = installed("transformers")
IN_WINDOW = TRL is not None and Version("0.20.0") <= TRL < Version("1.16.0")
needs_trl = pytest.mark.skipif(TRL is None, reason="needs trl")
needs_window = pytest.mark.skipif(not IN_WINDOW, reason=f"TRL {TRL} outside 0.20.0 - 1.15.x")

DDP_ERROR = "Expected to have finished reduction in the prior iteration before starting a new one"


# -- probe -------------------------------------------------------------------------------------


@needs_trl
def test_probe_on_installed_trl():
    from trl_compat.patches import vlm_ddp_find_unused as patch

    import trl.trainer.grpo_trainer as gt

    verdict = patch.probe(gt)
    if IN_WINDOW:
        assert verdict.needed is True and "ddp_find_unused_parameters" in verdict.reason, verdict
    elif TRL >= Version("1.16.0"):
        assert verdict.needed is False and "fixed code" in verdict.reason, verdict
    else:
        assert verdict.needed is False and "TRL < 0.20" in verdict.reason, verdict
    # 0.22 - 1.15: generation re-enables checkpointing with transformers' defaults (1.16 passes the kwargs)
    assert patch.reenables_with_defaults(gt) is (Version("0.22.0") <= TRL < Version("1.16.0")), TRL


TELLS = "if isinstance(processing_class, ProcessorMixin):\n    self._is_vlm = True\n"


@pytest.mark.parametrize(
    "body, expected",
    [
        (TELLS, True),
        (TELLS + "if self._is_vlm and args.ddp_find_unused_parameters is None:\n    args.ddp_find_unused_parameters = True\n", False),
        ("self._tokenizer = processing_class\n", False),  # no VLM support (TRL < 0.20)
        ("if type(processing_class) is ProcessorMixin:\n    self._is_vlm = True\n", None),  # unknown shape
    ],
)
def test_probe_on_written_code(tmp_path, body, expected):
    from trl_compat.patches import vlm_ddp_find_unused as patch

    path = tmp_path / "fake_grpo.py"
    path.write_text(
        "class ProcessorMixin:\n    pass\n\n"
        "class GRPOTrainer:\n    def __init__(self, model, args, processing_class=None):\n" + textwrap.indent(body, " " * 8) + "\n"
    )
    verdict = patch.probe(written_code.load(path))
    assert verdict.needed is expected, verdict


# -- the flag after GRPOTrainer.__init__ (one process) -------------------------------------------


# TRL 0.22 - 1.15 re-enable checkpointing after each generation with transformers' defaults: reentrant on
# transformers 4 whatever was asked, which DDP's unused-parameter search cannot join (the patch leaves it)
REENTRANT_AFTER_GENERATION = TRL is not None and Version("0.22.0") <= TRL < Version("1.16.0") and TF.major < 5


def _non_reentrant_expected():
    """``ddp_find_unused_parameters`` of a VLM trainer asked for non-reentrant checkpointing."""
    return None if REENTRANT_AFTER_GENERATION else True


def _default_config_expected():
    """The same with GRPO's default checkpointing: TRL 0.20 - 0.21 do not checkpoint by default (True, as
    transformers would choose); from 0.22 on transformers 4 the checkpointing is reentrant (left None);
    transformers 5 checkpoints non-reentrantly (True)."""
    if TRL < Version("0.22.0"):
        return True
    return None if TF.major < 5 else True


def _vlm_trainer(tmp_path, name, **overrides):
    import tiny_vlm

    return tiny_vlm.make_trainer(tmp_path / name, train_dataset=tiny_vlm.dataset(4).remove_columns("image"), steps=1, **overrides)


def _handler_flag(trainer):
    handler = getattr(getattr(trainer, "accelerator", None), "ddp_handler", None)
    return getattr(handler, "find_unused_parameters", "no handler")


@needs_window
def test_flag_after_init(tmp_path):
    import trl_compat

    import grpo_run

    assert trl_compat.status(PATCH_ID) == trl_compat.APPLIED, trl_compat.report()
    non_reentrant = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": False}}

    vlm = _vlm_trainer(tmp_path, "vlm", **non_reentrant)
    assert vlm.args.ddp_find_unused_parameters is _non_reentrant_expected(), (TRL, TF)
    if vlm.args.ddp_find_unused_parameters:
        assert _handler_flag(vlm) in (True, "no handler")  # transformers 4 builds it from args in train()

    default = _vlm_trainer(tmp_path, "default")
    assert default.args.ddp_find_unused_parameters is _default_config_expected(), (TRL, TF, default.args.gradient_checkpointing_kwargs)

    user = _vlm_trainer(tmp_path, "user", ddp_find_unused_parameters=False, **non_reentrant)
    assert user.args.ddp_find_unused_parameters is False
    assert _handler_flag(user) in (False, "no handler")

    reentrant = _vlm_trainer(tmp_path, "reentrant", gradient_checkpointing=True, gradient_checkpointing_kwargs={"use_reentrant": True})
    assert reentrant.args.ddp_find_unused_parameters is None

    text = grpo_run.make_trainer(tmp_path / "text", steps=1, **non_reentrant)
    assert text.args.ddp_find_unused_parameters is None

    with without_patch(PATCH_ID):  # TRL's own: transformers decides (no unused-parameter search under checkpointing)
        unpatched = _vlm_trainer(tmp_path, "unpatched", **non_reentrant)
    assert unpatched.args.ddp_find_unused_parameters is None
    assert _handler_flag(unpatched) in (False, "no handler")


# -- a real DDP run of the tiny VLM on text-only prompts (2 processes) -------------------------------


@needs_window
@only_in_cells("trl1.12.0-tf5.16.1", why="a 2-process DDP run of the tiny VLM (about 80 s)")
def test_ddp_text_only_batch(tmp_path):
    run = launch_two("vlm_ddp_worker.py", tmp_path, marker="VD|")
    assert run.returncode == 0, run.tail()
    for versions in run.per_rank("versions"):
        assert versions["status"] == "applied", versions

    # without the patch: transformers turns unused-parameter detection off under gradient checkpointing, the
    # vision tower gets no gradient in step 1, and DDP refuses step 2's forward
    for flags in run.per_rank("find_unused", phase="unpatched"):
        assert flags["args"] is None and flags["handler"] is False, flags
        assert flags["distributed_type"] == "DistributedType.MULTI_CPU" and flags["gradient_checkpointing"] is True, flags
    for error in run.per_rank("error", phase="unpatched"):
        assert error["type"] == "RuntimeError" and error["message"].startswith(DDP_ERROR), error
        assert "find_unused_parameters=True" in error["message"], error
    for train in run.per_rank("train", phase="unpatched"):
        assert train["steps"] == 1 and train["wrapped"] == "DistributedDataParallel", train

    # with it: DDP looks for unused parameters; two steps, the language model trained in step with both ranks
    for flags in run.per_rank("find_unused", phase="patched"):
        assert flags["args"] is True and flags["handler"] is True, flags
    for error in run.per_rank("error", phase="patched"):
        assert error["type"] is None, error
    trains = run.per_rank("train", phase="patched")
    for train in trains:
        assert train["steps"] == 2 and len(train["losses"]) == 2 and all(math.isfinite(x) for x in train["losses"]), train
        assert train["lm_moved"] > 1e-4 and train["vision_moved"] == 0.0, train
    assert trains[0]["lm_moved"] == trains[1]["lm_moved"], trains  # DDP averaged the gradients: the same weights
    assert len(run.per_rank("done")) == 2


@needs_trl
@pytest.mark.parametrize(
    "gc, kwargs, reenabled, expected",
    [
        (False, {"use_reentrant": True}, True, False),  # no checkpointing: nothing reentrant
        (True, {"use_reentrant": False}, False, False),
        (True, {"use_reentrant": True}, False, True),
        (True, {}, False, True),  # torch's default
        (True, None, False, "transformers"),
        (True, {"use_reentrant": False}, True, "transformers"),  # TRL 0.22 - 1.15 re-enable with the defaults
    ],
)
def test_reentrant_checkpointing(gc, kwargs, reenabled, expected):
    import types

    from trl_compat.patches import vlm_ddp_find_unused as patch

    args = types.SimpleNamespace(gradient_checkpointing=gc, gradient_checkpointing_kwargs=kwargs)
    if expected == "transformers":
        expected = TF.major < 5  # transformers 4's default is reentrant, 5's is not
    assert patch.reentrant_checkpointing(args, reenabled) is expected
