"""What the guard knows of one vLLM engine (floor 1): check C's state machine, W1/W2's watched
matrices and open sync, the trainer syncing into it, and the engine facts L's gate reads. The
observers build and update these records; the checks read and judge them."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Set

if TYPE_CHECKING:
    from trl_compat.guard.checks.watched import Finding, Watch


@dataclass
class Sync:
    """One weight sync being sent (W1): the ``load_weights`` calls of one step before ``generate``."""

    step: int
    trainer: Any  # the trainer whose weights are sent (None: unknown)
    count: int = 0  # tensors sent
    names: Set[str] = field(default_factory=set)  # their names, as vLLM names them
    findings: List["Finding"] = field(default_factory=list)


class Weights:
    """W1/W2's state for one in-process engine."""

    def __init__(self) -> None:
        self.watches: Dict[str, "Watch"] = {}
        self.params: Dict[str, Any] = {}  # watched name -> vLLM's parameter
        self.open: Optional[Sync] = None  # the sync being sent
        self.generated_at: Optional[int] = None  # the step of the last generate
        self.synced_since_generate = False


class EngineRecord:
    """One engine: in process (``llm`` set), or a server's seen from its client (``llm`` None)."""

    def __init__(
        self,
        llm: Any = None,
        prefix_caching: Optional[bool] = None,
        model: Any = None,
        logprobs_mode: Optional[str] = None,
    ) -> None:
        self.llm: Optional["weakref.ref[Any]"] = weakref.ref(llm) if llm is not None else None
        self.prefix_caching = prefix_caching
        self.model = model  # the engine's model, where vLLM keeps it in this process
        self.logprobs_mode = logprobs_mode  # vLLM's ``logprobs_mode`` (None: not set, or unknown)
        # C's state machine (checks.engine_calls)
        self.state = "checkpoint"  # checkpoint | synced | disk | discarded | lost | flagged
        self.asleep: Optional[int] = None  # the sleep level while asleep
        self.synced_while_asleep = False
        self.prefix_dirty = False
        self.generates = 0
        self.syncs = 0  # load_weights calls of the trainer's weight syncs
        self.last_sync_step = -1
        # the observer's bookkeeping
        self.inside: List[str] = []  # the engine calls in progress (a load_weights inside one is vLLM's own)
        self.own_loads = 0  # load_weights calls vLLM made itself (reload_weights reads the checkpoint through it)
        self.trainer: Optional["weakref.ref[Any]"] = None  # the trainer that syncs into and generates with this engine
        # W1/W2 (checks.weights)
        self.weights: Optional[Weights] = None

    def engine(self) -> Any:
        """The vLLM ``LLM`` (None: freed, or a server's engine)."""
        return self.llm() if self.llm is not None else None

    def driver(self) -> Any:
        """The trainer syncing into this engine, if still alive."""
        return self.trainer() if self.trainer is not None else None
