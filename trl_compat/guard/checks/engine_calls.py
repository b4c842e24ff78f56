"""Check C: the order of an in-process engine's calls between a weight sync and ``generate``.

After a sync that changed weights (one made after an optimizer step) and before the next
``generate``:

* the prefix cache must have been reset when prefix caching is on and the engine has generated
  before (its cached prompt blocks were computed with the old weights; vLLM 0.7's
  ``load_weights`` keeps them: the 0.15 ``vllm-prefix-cache`` bug);
* nothing may have reloaded the checkpoint (``collective_rpc("reload_weights")``: TRL #5312,
  ``vllm-sleep-mode-weights``), discarded the weights (``sleep(level=2)`` with no reload or
  sync after waking), or restored pre-sync weights (a sync while asleep at level 1 is
  overwritten by ``wake_up``: TRL #5142).

Pure call ordering: nothing is compared, so nothing can be a false alarm from rounding. Syncs at
step 0 send the checkpoint's own weights, so what happens after them cannot be wrong yet.
"""

from __future__ import annotations

from trl_compat.guard._engines import EngineRecord
from trl_compat.guard._ledger import Alarm
from trl_compat.guard._run import Run, fire

RELOAD = "reload_weights"


def synced(engine: EngineRecord, step: int) -> None:
    engine.syncs += 1
    engine.last_sync_step = step
    if engine.asleep is not None:
        engine.synced_while_asleep = True
    engine.state = "synced"
    if engine.prefix_caching and engine.generates:
        engine.prefix_dirty = True


def reset_prefix_cache(engine: EngineRecord, args: tuple, kwargs: dict, loaded: bool = False) -> None:
    # vLLM may answer False (requests still hold blocks) or None (0.9 V1): the call was made
    engine.prefix_dirty = False


def sleep(engine: EngineRecord, args: tuple, kwargs: dict, loaded: bool = False) -> None:
    level = kwargs.get("level", args[0] if args else 1)
    engine.asleep = int(level)
    engine.synced_while_asleep = False
    if engine.asleep >= 2:
        engine.state = "discarded"


def wake_up(engine: EngineRecord, args: tuple, kwargs: dict, loaded: bool = False) -> None:
    tags = kwargs.get("tags", args[0] if args else None)
    if tags is not None and "weights" not in tags:
        return
    if engine.synced_while_asleep and engine.state == "synced":
        engine.state = "lost"
    engine.asleep = None
    engine.synced_while_asleep = False


def collective_rpc(engine: EngineRecord, args: tuple, kwargs: dict, loaded: bool = False) -> None:
    """``loaded``: vLLM called its model's ``load_weights`` during the call. A reload that loaded
    nothing was made a no-op (trl_compat's ``vllm-sleep-mode-weights`` does so after a sync); where
    the model is out of reach (another process), the call is taken at its word."""
    method = kwargs.get("method", args[0] if args else None)
    name = method if isinstance(method, str) else getattr(method, "__name__", None)
    if name == RELOAD and (loaded or engine.model is None):
        engine.state = "disk"


def before_generate(engine: EngineRecord, run: Run | None) -> None:
    """Judge the calls since the last sync, as ``generate`` starts (for ``run``'s step; step 0 for
    an engine no trainer drives)."""
    step = run.step if run is not None else 0
    moved = engine.last_sync_step > 0  # the last sync sent weights an optimizer step had changed
    if moved and engine.state == "disk":
        fire(
            run,
            Alarm(
                "C",
                f"vLLM reloaded the on-disk checkpoint (collective_rpc({RELOAD!r})) after the weight sync of step "
                f"{engine.last_sync_step}, and generates from it",
                "the sleep-mode reload runs after the sync (TRL #5312, TRL 0.25+ with vllm_enable_sleep_mode=True)",
                fix="vllm-sleep-mode-weights",
                figures={"last_sync_step": engine.last_sync_step},
                step=step,
            ),
        )
    elif moved and engine.state == "discarded":
        fire(
            run,
            Alarm(
                "C",
                "vLLM generates after sleep(level=2) discarded its weights, with no reload or weight sync since",
                "sleep level 2 without a re-sync (vLLM #29341)",
                fix="vllm-sleep-mode-weights",
                step=step,
            ),
        )
    elif moved and engine.state == "lost":
        fire(
            run,
            Alarm(
                "C",
                f"the weight sync of step {engine.last_sync_step} was written into a sleeping engine and wake_up() "
                "restored the weights from before it",
                "a sync while vLLM sleeps (TRL #5142, fixed in TRL 0.29.0)",
                step=step,
            ),
        )
    if moved and engine.prefix_dirty:
        fire(
            run,
            Alarm(
                "C",
                f"the weights changed at the sync of step {engine.last_sync_step} but the prefix cache was not reset: "
                "prompt blocks cached under the old weights are served",
                "no reset_prefix_cache() after load_weights (TRL 0.15's vllm-prefix-cache bug)",
                fix="vllm-prefix-cache",
                figures={"last_sync_step": engine.last_sync_step},
                step=step,
            ),
        )
        engine.prefix_dirty = False  # once per sync
    if engine.state in ("disk", "discarded", "lost") and moved:
        engine.state = "flagged"  # alarmed; the next sync re-arms
    engine.generates += 1
