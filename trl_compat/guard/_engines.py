"""What the guard knows of one vLLM engine (floor 1): check C's state machine, W1/W2's watched
matrices (their sampled elements and snapshots) and open sync, the trainer syncing into it, and the engine facts L's gate reads. The
observers build and update these records; the checks read and judge them."""

from __future__ import annotations

import weakref
import zlib
from dataclasses import dataclass, field
from typing import Any

SAMPLE = 4096  # elements per watched matrix (W1/W2)


@dataclass
class Finding:
    """One sent matrix W1 found wrong."""

    name: str
    kind: str  # differs | unmerged | corrupted
    frac: float  # fraction of sampled elements
    max: float  # max |sent - expected|


class Watch:
    """One watched matrix: its sampled indices and snapshots (vLLM's dtype, 1-D, CPU)."""

    def __init__(self, name: str, param: Any) -> None:
        import torch

        self.name = name
        numel = param.numel()
        generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))  # the same on every rank
        self.index = torch.randperm(numel, generator=generator)[:SAMPLE].sort().values if numel > SAMPLE else torch.arange(numel)
        self.shape = tuple(param.shape)
        self.dtype = param.dtype
        self.checkpoint = self.engine_values(param)  # what the engine holds when built
        self.verified: bool | None = None  # None: not sent yet; False: vLLM stores it transformed
        self.last: Any | None = None  # the last sync's sent elements, in vLLM's dtype
        self.previous: Any | None = None
        self.sent: Any | None = None  # sent in the open sync, not yet loaded
        self.trainer_last: Any | None = None  # the trainer's expected elements at the last sync (or first generate)

    def engine_values(self, param: Any) -> Any:
        return param.detach().reshape(-1)[self.index.to(param.device)].to("cpu").clone()


@dataclass
class Sync:
    """One weight sync being sent (W1): the ``load_weights`` calls of one step before ``generate``."""

    step: int
    trainer: Any  # the trainer whose weights are sent (None: unknown)
    count: int = 0  # tensors sent
    names: set[str] = field(default_factory=set)  # their names, as vLLM names them
    findings: list[Finding] = field(default_factory=list)


class Weights:
    """W1/W2's state for one in-process engine."""

    def __init__(self) -> None:
        self.watches: dict[str, Watch] = {}
        self.params: dict[str, Any] = {}  # watched name -> vLLM's parameter
        self.open: Sync | None = None  # the sync being sent
        self.generated_at: int | None = None  # the step of the last generate
        self.synced_since_generate = False


class EngineRecord:
    """One engine: in process (``llm`` set), or a server's seen from its client (``llm`` None)."""

    def __init__(
        self,
        llm: Any = None,
        prefix_caching: bool | None = None,
        model: Any = None,
        logprobs_mode: str | None = None,
    ) -> None:
        self.llm: weakref.ref[Any] | None = weakref.ref(llm) if llm is not None else None
        self.prefix_caching = prefix_caching
        self.model = model  # the engine's model, where vLLM keeps it in this process
        self.logprobs_mode = logprobs_mode  # vLLM's ``logprobs_mode`` (None: not set, or unknown)
        # C's state machine (checks.engine_calls)
        self.state = "checkpoint"  # checkpoint | synced | disk | discarded | lost | flagged
        self.asleep: int | None = None  # the sleep level while asleep
        self.synced_while_asleep = False
        self.prefix_dirty = False
        self.generates = 0
        self.syncs = 0  # load_weights calls of the trainer's weight syncs
        self.last_sync_step = -1
        # the observer's bookkeeping
        self.inside: list[str] = []  # the engine calls in progress (a load_weights inside one is vLLM's own)
        self.own_loads = 0  # load_weights calls vLLM made itself (reload_weights reads the checkpoint through it)
        self.trainer: weakref.ref[Any] | None = None  # the trainer that syncs into and generates with this engine
        # W1/W2 (checks.weights)
        self.weights: Weights | None = None

    def engine(self) -> Any:
        """The vLLM ``LLM`` (None: freed, or a server's engine)."""
        return self.llm() if self.llm is not None else None

    def driver(self) -> Any:
        """The trainer syncing into this engine, if still alive."""
        return self.trainer() if self.trainer is not None else None
