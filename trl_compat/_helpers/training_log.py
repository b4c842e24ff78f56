"""What a training run shows of trl_compat, through transformers' callbacks.

* One line in the training log when a ``GRPOTrainer`` is built, once per process, on the main
  process only (``TRL_COMPAT_QUIET=1``: none)::

      trl_compat X.Y.Z: fixes that change this run's numbers: scale-rewards-swapped; fixes that
      prevent a crash: eval-before-train-ga; disabled: logps-temperature; off-policy guard: off;
      details: python -m trl_compat

  The fixes are split by what they do to a run: one that changes its numbers (its bug trains
  silently wrong: the registry's ``symptom`` says "silent") tells a user who tuned on the buggy
  release that the loss and metrics move; one that prevents a crash changes nothing a working
  run computed. The guard's part says its mode, and, where it is on but the run has no vLLM,
  that it has nothing to check.

* The applied ids in the trainer's first logged training metrics, ``trl_compat/applied/<id>: 1``,
  so that W&B, TensorBoard and ``trainer.state.log_history`` carry them.
* One WARNING per known TRL bug trl_compat does not fix that this run's set-up meets
  (:mod:`trl_compat.ledger.runtime`).
* Under ``TRL_COMPAT_STRICT=1``, a patch failure held back from TRL's lazy import (see
  :func:`inside_trl_lazy_import`) is raised as :class:`TrlCompatError` when the trainer is built.

Both go through :class:`TrlCompatCallback`, added to transformers' ``trainer.DEFAULT_CALLBACKS``
(every ``Trainer`` starts with those), not through a wrapper of ``GRPOTrainer.__init__``: the
patches wrap that in an order the engine computes from their declarations, and this must not
take a place in it. The callback acts only for trainers built with a ``GRPOConfig``.
"""

from __future__ import annotations

import logging
import os
import sys
from types import FrameType

from trl_compat._engine import settings
from trl_compat._engine.patch import _TROUBLE, APPLIED, DISABLED, TrlCompatError
from trl_compat._engine.reporting import report
from trl_compat._engine.state import REGISTRY

LOGGER_NAME = "trl_compat.training"
METRIC_PREFIX = "trl_compat/applied/"
DETAILS = "python -m trl_compat"

_announced = False  # once per process, however many trainers it builds
_callback_class = None


def changes_numbers(patch_id: str) -> bool:
    """Whether the patch fixes a bug that trains silently wrong, so that applying it changes a
    run's numbers (the registry's ``symptom`` is the one place that says so: it starts "silent")."""
    return REGISTRY.patch(patch_id).symptom.lstrip().lower().startswith("silent")


def guard_part(uses_vllm: bool | None) -> str:
    """The guard's mode for the line; where it is on and this run has no vLLM, that it checks nothing."""
    mode = settings.guard_mode()
    if mode == "off":
        return "off-policy guard: off"
    if uses_vllm is False:
        return f"off-policy guard: {mode}, nothing to check (this run uses no vLLM)"
    return f"off-policy guard: {mode}"


def summary_line(uses_vllm: bool | None = None) -> str:
    """The line the training log shows: the applied fixes (those that change a run's numbers apart
    from those that prevent a crash), disabled ones, skipped ones, the guard, where the details are."""
    import trl_compat

    records = report()
    applied = [r.id for r in records if r.status == APPLIED]
    numbers = [pid for pid in applied if changes_numbers(pid)]
    crashes = [pid for pid in applied if pid not in numbers]
    parts = []
    if numbers:
        parts.append("fixes that change this run's numbers: " + ", ".join(numbers))
    if crashes:
        parts.append("fixes that prevent a crash: " + ", ".join(crashes))
    if not applied:
        parts.append("active fixes: none")
    disabled = [r.id for r in records if r.status == DISABLED]
    if disabled:
        parts.append("disabled: " + ", ".join(disabled))
    trouble = [f"{r.id} ({r.status})" for r in records if r.status in _TROUBLE]
    if trouble:
        parts.append("skipped: " + ", ".join(trouble))
    parts.append(guard_part(uses_vllm))
    parts.append("details: " + DETAILS)
    return f"trl_compat {trl_compat.__version__}: " + "; ".join(parts)


def announce(main_process: bool = True, uses_vllm: bool | None = None) -> bool:
    """Log :func:`summary_line` once per process, on the main process, unless ``TRL_COMPAT_QUIET``.
    Returns whether it logged."""
    global _announced
    if _announced or not main_process or settings.switch(settings.QUIET):
        return False
    _announced = True
    logger = logging.getLogger(LOGGER_NAME)
    # A script that configures no logging would never show an INFO record: the trl_compat
    # loggers inherit the root's WARNING, and with no handler anywhere logging's last resort
    # prints WARNING and above only (transformers' own set-up touches the `transformers` logger
    # alone). The line is what tells a user the fixes are on, so unless someone set a level on
    # trl_compat's loggers (then theirs decides), this logger takes INFO, and where neither it
    # nor an ancestor (root included) has a handler it gets one of its own on stderr. A handler
    # configured later (logging.basicConfig) cannot print it twice: it is logged once.
    if logging.getLogger("trl_compat").level == logging.NOTSET and logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.info("%s", summary_line(uses_vllm))
    return True


def _global_rank_zero() -> bool:
    """Whether this is rank 0 of the launch. The trainer's own answer is not enough: on the CPU,
    transformers 5 leaves a torchrun launch's ranks undistributed (``parallel_mode`` is not
    DISTRIBUTED) and every rank calls itself the world's main process."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return os.environ.get("RANK", "0") == "0"


def applied_metrics() -> dict:
    """``{"trl_compat/applied/<id>": 1}`` per applied patch: numbers, which every integration logs
    (TensorBoard's drops strings, with a warning)."""
    return {METRIC_PREFIX + r.id: 1 for r in report() if r.status == APPLIED}


def inside_trl_lazy_import() -> bool:
    """True while TRL's lazy module imports one of its submodules (``from trl import GRPOTrainer``).

    TRL's ``_LazyModule._get_module`` turns any exception raised during that import into
    ``RuntimeError: Failed to import trl.trainer.grpo_trainer ...``: a strict-mode failure raised
    there would reach the user as TRL's error, its own message only in the chained cause."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_get_module" and frame.f_globals.get("__name__") == "trl.import_utils":
            return True
        frame = frame.f_back
    return False


def held_failures() -> list:
    """Under ``TRL_COMPAT_STRICT=1``: the failures held back from TRL's lazy import, once each
    (not every patch now in a trouble status: a status an earlier failure left, already raised
    where it happened, is not raised again)."""
    return REGISTRY.take_held_failures()


def _is_grpo(args) -> bool:
    config = getattr(sys.modules.get("trl.trainer.grpo_config"), "GRPOConfig", None)
    return config is not None and isinstance(args, config)


def callback_class() -> type:
    global _callback_class
    if _callback_class is None:
        from transformers import TrainerCallback

        class TrlCompatCallback(TrainerCallback):
            """trl_compat's line in the training log and its ids in the logged metrics (GRPO trainers only)."""

            def __init__(self) -> None:
                self.metrics_logged = False

            def on_init_end(self, args, state, control, **kwargs):
                if not _is_grpo(args):
                    return
                failures = held_failures()
                if failures:
                    raise TrlCompatError("TRL_COMPAT_STRICT=1: " + "; ".join(failures))
                announce(
                    main_process=state.is_world_process_zero and _global_rank_zero(),
                    uses_vllm=bool(getattr(args, "use_vllm", False)),
                )
                if state.is_world_process_zero and _global_rank_zero():
                    # The known bugs trl_compat leaves unfixed that this run's set-up meets: one warning each.
                    from trl_compat.ledger import runtime

                    runtime.check(args, kwargs.get("model"))

            def on_log(self, args, state, control, logs=None, **kwargs):
                if self.metrics_logged or logs is None or "loss" not in logs or not _is_grpo(args):
                    return
                self.metrics_logged = True
                metrics = applied_metrics()
                # The integrations (W&B, TensorBoard...) come after DEFAULT_CALLBACKS in the
                # handler's list and receive this same dict; the history entry is a copy of it.
                logs.update(metrics)
                if state.log_history and state.log_history[-1].get("loss") == logs.get("loss"):
                    state.log_history[-1].update(metrics)

        _callback_class = TrlCompatCallback
    return _callback_class


def add() -> None:
    """Put the callback into ``transformers.trainer.DEFAULT_CALLBACKS`` (once): trainers built from now on get it."""
    import transformers.trainer

    defaults = transformers.trainer.DEFAULT_CALLBACKS
    if callback_class() not in defaults:
        defaults.append(callback_class())


def remove() -> None:
    """Take it out again (``trl_compat.revert()``); trainers already built keep theirs."""
    trainer = sys.modules.get("transformers.trainer")
    defaults = getattr(trainer, "DEFAULT_CALLBACKS", None)
    if defaults is not None and _callback_class in defaults:
        defaults.remove(_callback_class)
