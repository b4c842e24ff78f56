"""The engine's state and its one owner, :class:`Registry`: every patch registered, in the order
they stack, its state, the lock that guards both, and the one place a status is set (and
logged, and raised on under ``TRL_COMPAT_STRICT=1``). Also the switches read from the
environment."""

from __future__ import annotations

import _thread

from trl_compat._engine import logs, settings
from trl_compat._engine.patch import _TROUBLE, APPLIED, PENDING, TrlCompatError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import ModuleType
    from typing import Callable

    from trl_compat._engine.patch import Patch
    from trl_compat._engine.patcher import Patcher

log = logs.getLogger(__name__)


class PatchState:
    """What the engine knows of one patch now."""

    __slots__ = ("status", "reason", "versions", "generation", "patcher", "module", "changed")

    def __init__(self) -> None:
        self.status, self.reason = PENDING, ""
        self.versions: dict[str, str | None] = {}  # distribution -> installed version (None: not installed)
        self.generation = 0  # bumped by revert(): hooks from older generations do nothing
        self.patcher: Patcher | None = None  # the Patcher of the applied patch
        self.module: ModuleType | None = None  # the trigger module, once imported
        self.changed: list[str] = []  # the same, as dotted names, for the report


class Registry:
    """Owns the engine's state: the patches by id in registration order (the order in which
    patches that change one attribute stack), a :class:`PatchState` for each, and the lock.
    Iterating gives the ids. :mod:`.lifecycle` changes states under ``lock``; :mod:`.reporting`
    reads them under it.

    ``trl_compat`` fills it on first use (:meth:`fill_on_first_use`): its patches, registered
    before anything else can be, whether TRL's import or a call of the API comes first."""

    def __init__(self) -> None:
        self.lock = _thread.RLock()
        self._fill: Callable[[], None] | None = None
        self._patches: dict[str, Patch] = {}
        self._states: dict[str, PatchState] = {}
        self._held: list[str] = []  # strict-mode failures a hold kept from raising where they happened
        # work the fill asked for that must run once ``lock`` is released (see ``after_fill``)
        self._filling = False
        self._after_fill: list[Callable[[], None]] = []

    def fill_on_first_use(self, fill: Callable[[], None]) -> None:
        """Call ``fill()`` (once) before the registry is next read or added to."""
        self._fill = fill

    def _filled(self) -> None:
        if self._fill is None:
            return
        with self.lock:
            fill, self._fill = self._fill, None
            if fill is not None:
                self._filling = True
                try:
                    fill()
                finally:
                    self._filling = False
        # Outside the lock: a post-import hook registered here fires at once for a module already in
        # sys.modules, and waits for the thread still executing it, which may be waiting for our lock.
        while self._after_fill:
            self._after_fill.pop(0)()

    def after_fill(self, work: Callable[[], None]) -> bool:
        """While the registry is being filled (under ``lock``), keep ``work`` to run once the fill has
        released the lock, and return True; otherwise return False (the caller runs it now)."""
        if not self._filling:
            return False
        self._after_fill.append(work)
        return True

    def __iter__(self) -> Iterator[str]:
        self._filled()
        return iter(list(self._patches))

    def __contains__(self, patch_id: object) -> bool:
        self._filled()
        return patch_id in self._patches

    def register(self, patch: Patch) -> None:
        self._filled()
        with self.lock:
            if patch.id in self._patches and self._patches[patch.id] is not patch:
                raise ValueError(f"duplicate patch id {patch.id!r}")
            self._patches[patch.id] = patch
            self._states.setdefault(patch.id, PatchState())

    def redeclare(self, patch: Patch) -> Patch:
        """Put ``patch`` in place of the registered declaration with its id, keeping the patch's
        state and position; returns the declaration it replaced."""
        with self.lock:
            old = self._patches[patch.id]
            self._patches[patch.id] = patch
            return old

    def forget(self, patch_id: str) -> None:
        """Drop a patch and its state, without touching what it changed."""
        with self.lock:
            del self._patches[patch_id]
            del self._states[patch_id]

    def patches(self) -> list[Patch]:
        self._filled()
        return list(self._patches.values())

    def patch(self, patch_id: str) -> Patch:
        self._filled()
        return self._patches[patch_id]

    def state(self, patch_id: str) -> PatchState:
        self._filled()
        return self._states[patch_id]

    def select(self, ids: Sequence[str]) -> list[Patch]:
        """The patches with these ids (all, when none is given); KeyError naming unknown ids."""
        self._filled()
        unknown = [i for i in ids if i not in self._patches]
        if unknown:
            raise KeyError(f"unknown trl_compat patch ids: {unknown}")
        return [self._patches[i] for i in ids] if ids else self.patches()

    def position(self, patch: Patch) -> int:
        return list(self._patches).index(patch.id)

    def with_status(self, *statuses: str) -> list[str]:
        self._filled()
        with self.lock:
            return [pid for pid, state in self._states.items() if state.status in statuses]

    def set_status(self, patch: Patch, status: str, reason: str) -> None:
        """The one place a status is set: logged (a warning for trouble), raised under strict."""
        state = self._states[patch.id]
        state.status, state.reason = status, reason
        if status in _TROUBLE:
            log.warning("trl_compat: %s: %s (%s); this patch is skipped", patch.id, status, reason)
            if settings.switch(settings.STRICT):
                failure = f"{patch.id}: {status}: {reason}"
                if settings.strict():
                    raise TrlCompatError(failure)
                self._held.append(failure)
        else:
            log.debug("trl_compat: %s: %s (%s)", patch.id, status, reason)

    def take_held_failures(self) -> list[str]:
        """The strict-mode failures held back since the last call (see ``settings.hold_strict_when``),
        for whoever raises them later; each is handed out once."""
        with self.lock:
            held, self._held = self._held, []
            return held

    def settled_summary(self) -> str | None:
        """The one-line summary once no patch is pending (None while one is)."""
        self._filled()
        with self.lock:
            if any(s.status == PENDING for s in self._states.values()):
                return None
            applied = [pid for pid, s in self._states.items() if s.status == APPLIED]
            trouble = [f"{pid} ({s.status})" for pid, s in self._states.items() if s.status in _TROUBLE]
            others = len(self._states) - len(applied) - len(trouble)
        return "trl_compat: applied {}; {} not needed or disabled{} (details: python -m trl_compat)".format(
            ", ".join(applied) or "nothing", others, f"; skipped: {', '.join(trouble)}" if trouble else ""
        )

    def log_summary_when_settled(self) -> None:
        summary = self.settled_summary()
        if summary is not None:
            log.info("%s", summary)


REGISTRY = Registry()


def register(patch: Patch) -> None:
    REGISTRY.register(patch)


def registry() -> list[Patch]:
    return REGISTRY.patches()
