"""The patch engine: one registry, one way to gate, one way to apply and revert.

A patch is declared once as a :class:`Patch` (data plus ``probe`` and ``apply``).
Its life:

1. *Gate* (at ``install()``, cheap): the installed versions, read from
   ``importlib.metadata`` without importing anything, must lie in the patch's
   windows. Out of window: "not needed". Unreadable version: "unknown version".
2. *Wait*: a wrapt post-import hook on the patch's trigger module. It fires at
   once if the module is already imported, so import order does not matter.
3. *Probe* the real code: only a probe that finds the bug lets the patch apply.
4. *Apply* through a :class:`Patcher`, which records every attribute it
   changes. If ``apply`` raises, the records are undone: nothing is left
   half-patched. ``revert()`` undoes the same records.

Nothing here raises into the user's program unless ``TRL_COMPAT_STRICT=1``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import inspect
import logging
import os
import threading
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence

import wrapt
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from trl_compat._source import SourceUnavailable

log = logging.getLogger("trl_compat")

# Statuses a patch can be in; the report shows them verbatim.
PENDING = "pending"  # in window, waiting for its trigger module to be imported
APPLIED = "applied"
NOT_NEEDED = "not needed"
DISABLED = "disabled"
UNKNOWN_VERSION = "unknown version"
UNDECIDED = "undecided"  # the probe could not tell whether the bug is there
TARGET_MISSING = "target missing"
FAILED = "failed"
CONFLICT = "conflict"  # someone else (e.g. Unsloth) replaced the class the patch targets
REVERTED = "reverted"

# Statuses that mean "a patch that may be needed could not be applied".
_TROUBLE = {UNKNOWN_VERSION, UNDECIDED, TARGET_MISSING, FAILED, CONFLICT}

MARKER = "__trl_compat_patch__"


class TrlCompatError(RuntimeError):
    """Raised instead of degrading quietly when ``TRL_COMPAT_STRICT=1``."""


class Verdict(NamedTuple):
    """What a probe found. ``needed`` is True, False, or None (cannot tell)."""

    needed: Optional[bool]
    reason: str


def needed(reason: str) -> Verdict:
    return Verdict(True, reason)


def not_needed(reason: str) -> Verdict:
    return Verdict(False, reason)


def undecided(reason: str) -> Verdict:
    return Verdict(None, reason)


@dataclass(frozen=True)
class Patch:
    id: str
    summary: str
    upstream: str
    module: str  # importing this module triggers the patch
    target: str  # dotted path inside ``module``; must resolve before probing
    requires: Mapping[str, str]  # distribution -> PEP 440 specifier set
    probe: Callable[[ModuleType], Verdict]
    apply: Callable[[ModuleType, "Patcher"], None]
    remove_when: str = ""
    # An environment variable that must be on for the patch to apply (a fix that changes the
    # training objective): off, a patch whose probe finds the bug reports "disabled".
    opt_in: str = ""


@dataclass
class PatchStatus:
    """One line of ``report()``."""

    id: str
    status: str
    reason: str
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    target: str = ""
    summary: str = ""
    upstream: str = ""

    def as_dict(self) -> Dict[str, Any]:
        return asdict(self)


_MISSING = object()


class AlreadyPatched(RuntimeError):
    """The attribute already carries this patch: another copy of trl_compat applied it."""


def markers(value: Any) -> frozenset:
    """The ids of the patches whose wrappers ``value`` is (or sits on top of)."""
    found = getattr(getattr(value, "__func__", value), MARKER, ())
    return frozenset(found) if isinstance(found, (set, frozenset, tuple, list)) else frozenset({found})


def raw_attribute(owner: Any, name: str) -> Any:
    """``name`` as stored in the first ``__dict__`` along ``owner``'s MRO (a module's own
    ``__dict__``): descriptors such as staticmethod and classmethod come back as they are."""
    for holder in (inspect.getmro(owner) if isinstance(owner, type) else (owner,)):
        if name in vars(holder):
            return vars(holder)[name]
    raise AttributeError(f"{getattr(owner, '__name__', owner)!r} has no attribute {name!r}")


class Patcher:
    """Records every change a patch makes, so it can be undone exactly."""

    def __init__(self, patch_id: str):
        self.patch_id = patch_id
        self._changes: List[tuple] = []

    def wrap(self, owner: Any, name: str, factory: Callable[[Any], Any]) -> Any:
        """Set ``owner.name = factory(original)``, where ``original`` is the function found
        along the MRO; a staticmethod or classmethod is unwrapped for the factory and its
        result re-wrapped the same way. Returns what was set."""
        raw = raw_attribute(owner, name)
        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        new = factory(raw.__func__ if kind else raw)
        return self.replace(owner, name, kind(new) if kind else new, above=raw)

    def replace(self, owner: Any, name: str, new: Any, above: Any = _MISSING) -> Any:
        """Set ``owner.name = new`` and return it. ``new`` is marked with this patch's id
        (plus the ids of the wrappers it sits ``above``); an attribute already marked with
        it raises :class:`AlreadyPatched`. Undo deletes what was inherited instead of
        re-setting it."""
        current = vars(owner).get(name, _MISSING)
        if self.patch_id in markers(current) and not any(c[0] is owner and c[1] == name for c in self._changes):
            raise AlreadyPatched(f"{_qualified(owner, name)} already carries {self.patch_id}")
        # functools.wraps copied the wrapped function's marker onto ``new``: keep that chain
        carried = markers(above if above is not _MISSING else new)
        if callable(new) or isinstance(new, (staticmethod, classmethod)):
            try:
                setattr(getattr(new, "__func__", new), MARKER, carried | {self.patch_id})
            except (AttributeError, TypeError):  # builtins, slots
                pass
        setattr(owner, name, new)
        self._changes.append((owner, name, current, new))
        return new

    def on_undo(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the patch is reverted or rolled back (state that is no attribute)."""
        self._changes.append((None, None, undo, None))

    def touched(self) -> frozenset:
        return frozenset((id(owner), name) for owner, name, _, _ in self._changes if owner is not None)

    def changed(self) -> List[str]:
        """The attributes this patch set, as dotted names (the report's target)."""
        return list(dict.fromkeys(_qualified(o, n) for o, n, _, _ in self._changes if o is not None))

    def undo(self) -> None:
        while self._changes:
            owner, name, old, new = self._changes.pop()
            if owner is None:
                old()
                continue
            current = vars(owner).get(name, _MISSING)
            if current is not new:
                # Someone replaced our value after us; putting the old one
                # back would silently drop their change.
                log.warning(
                    "trl_compat: %s: %s.%s was replaced after %s patched it; left as it is",
                    self.patch_id, getattr(owner, "__name__", owner), name, self.patch_id,
                )
                continue
            if old is _MISSING:
                delattr(owner, name)  # was inherited: re-setting would shadow the base
            else:
                setattr(owner, name, old)


def _qualified(owner: Any, name: str) -> str:
    if isinstance(owner, ModuleType):
        return f"{owner.__name__}.{name}"
    return f"{getattr(owner, '__module__', '?')}.{getattr(owner, '__qualname__', type(owner).__name__)}.{name}"


@dataclass
class _State:
    status: str = PENDING
    reason: str = ""
    versions: Dict[str, Optional[str]] = field(default_factory=dict)
    generation: int = 0  # bumped by revert(): hooks from older generations do nothing
    patcher: Optional[Patcher] = None
    module: Optional[ModuleType] = None
    touched: frozenset = frozenset()  # (id(owner), name) it changed when last applied; kept after revert
    changed: List[str] = field(default_factory=list)  # the same, as dotted names, for the report


_lock = threading.RLock()
_registry: Dict[str, Patch] = {}
_states: Dict[str, _State] = {}


def register(patch: Patch) -> None:
    with _lock:
        if patch.id in _registry and _registry[patch.id] is not patch:
            raise ValueError(f"duplicate patch id {patch.id!r}")
        _registry[patch.id] = patch
        _states.setdefault(patch.id, _State())


def registry() -> List[Patch]:
    return list(_registry.values())


# -- configuration --------------------------------------------------------------


def strict() -> bool:
    return switched_on("TRL_COMPAT_STRICT")


def switched_on(variable: str) -> bool:
    return os.environ.get(variable, "").strip().lower() in {"1", "true", "yes", "on"}


def _disabled_ids() -> set:
    raw = os.environ.get("TRL_COMPAT_DISABLE", "")
    ids = {part.strip() for part in raw.split(",") if part.strip()}
    unknown = ids - set(_registry) - {"*"}
    if unknown:
        log.warning("trl_compat: TRL_COMPAT_DISABLE names unknown patch ids %s; known: %s",
                    sorted(unknown), sorted(_registry))
    return ids


# -- version gate -----------------------------------------------------------------


def dist_version(dist: str) -> Optional[str]:
    """The installed version of a distribution, without importing it."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _importable_without_metadata(dist: str) -> bool:
    try:
        return importlib.util.find_spec(dist.replace("-", "_")) is not None
    except (ImportError, ValueError):
        return False


def affected(since: str, fixed_in: Optional[str] = None) -> str:
    """The version window of a bug present from release ``since`` up to the release
    ``fixed_in`` (exclusive; None: not fixed in any release trl_compat knows).

    Both ends hold the main-branch builds around them: ``X.dev0`` installs come
    before release X under PEP 440, so ``>=since.dev0``; and the fix lands somewhere
    among the ``fixed_in`` dev builds, which ``<fixed_in`` would leave out, so the
    window ends before ``fixed_in``'s first alpha. Which dev builds hold the bug is
    the probe's to tell, from the code."""
    lower = Version(since)
    spec = f">={lower.base_version}.dev0" if lower.pre is None and lower.dev is None else f">={since}"
    if fixed_in is not None:
        spec += f",<{Version(fixed_in).base_version}a0"
    return spec


def gate(patch: Patch):
    """Return ``(status or None, reason, versions)``; ``None`` means in window."""
    versions: Dict[str, Optional[str]] = {}
    for dist, spec in patch.requires.items():
        raw = dist_version(dist)
        versions[dist] = raw
        if raw is None:
            if _importable_without_metadata(dist):
                return (UNKNOWN_VERSION,
                        f"{dist} is importable but has no distribution metadata, so its version is unknown",
                        versions)
            return NOT_NEEDED, f"{dist} is not installed", versions
        try:
            version = Version(raw)
        except InvalidVersion:
            return UNKNOWN_VERSION, f"{dist} reports version {raw!r}, which is not a PEP 440 version", versions
        try:
            window = SpecifierSet(spec, prereleases=True)
        except InvalidSpecifier:  # a bug of ours; never the user's problem
            return FAILED, f"invalid version window {spec!r} for {dist}", versions
        if not window.contains(version):
            return NOT_NEEDED, f"{dist} {raw} is outside the affected window {spec}", versions
    return None, "", versions


# -- lifecycle ----------------------------------------------------------------------


def _select(ids: Sequence[str]) -> List[Patch]:
    unknown = [i for i in ids if i not in _registry]
    if unknown:
        raise KeyError(f"unknown trl_compat patch ids: {unknown}")
    return [_registry[i] for i in ids] if ids else registry()


def _set(patch: Patch, status: str, reason: str) -> None:
    state = _states[patch.id]
    state.status, state.reason = status, reason
    if status in _TROUBLE:
        log.warning("trl_compat: %s: %s (%s); this patch is skipped", patch.id, status, reason)
        if strict():
            raise TrlCompatError(f"{patch.id}: {status}: {reason}")
    else:
        log.debug("trl_compat: %s: %s (%s)", patch.id, status, reason)


def install(*ids: str) -> None:
    """Gate the given patches (default: all) and hook them to their trigger
    modules. Idempotent: an applied or waiting patch is left alone.

    Patches that change the same attribute always stack in registration order:
    an applied patch that belongs above one applied again here comes off first
    and goes back on after it."""
    disabled = _disabled_ids()
    to_hook = []
    with _lock:
        selected = _select(ids)
        above = _stacked_above([p for p in selected if _states[p.id].patcher is None])
        for patch in sorted(above, key=_position, reverse=True):
            _take_off(patch, "taken off to re-apply a patch below it")
        for patch in sorted(_unique(selected + above), key=_position):
            state = _states[patch.id]
            if state.patcher is not None or (state.status == PENDING and state.generation > 0):
                continue
            if "*" in disabled or patch.id in disabled:
                _set(patch, DISABLED, "switched off by TRL_COMPAT_DISABLE")
                continue
            status, reason, state.versions = gate(patch)
            if status is not None:
                _set(patch, status, reason)
                continue
            state.generation += 1
            state.status, state.reason = PENDING, f"waiting for `import {patch.module}`"
            to_hook.append((patch, state.generation))
    # Outside our lock: the hook fires right here if the module is already loaded.
    for patch, generation in to_hook:
        wrapt.register_post_import_hook(_make_hook(patch.id, generation), patch.module)


def _make_hook(patch_id: str, generation: int) -> Callable[[ModuleType], None]:
    def hook(module: ModuleType) -> None:
        if getattr(getattr(module, "__spec__", None), "_initializing", False):
            # wrapt fires as soon as the module is in sys.modules, possibly while
            # another thread is still executing it. import_module waits for that
            # thread (outside our lock: it may need our lock for its own hooks).
            try:
                module = importlib.import_module(module.__name__)
            except Exception:  # noqa: BLE001 - its import failed: nothing to patch
                return
        with _lock:
            state = _states[patch_id]
            if state.generation != generation or state.status != PENDING:
                return  # neutralised by revert(), or already handled
            _resolve(_registry[patch_id], module)
            _log_summary_when_settled()

    return hook


def _resolve_target(module: ModuleType, dotted: str) -> Any:
    obj: Any = module
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _foreign_owner(patch: Patch, module: ModuleType) -> Optional[str]:
    """Name the class that replaced the module's own one (Unsloth does this), if any."""
    owner = getattr(module, patch.target.split(".")[0], None)
    if isinstance(owner, type) and owner.__module__ != module.__name__:
        return f"{owner.__module__}.{owner.__qualname__}"
    return None


def _overriding_subclasses(patch: Patch, module: ModuleType) -> List[str]:
    """Subclasses that define the patched method themselves: the fix reaches them only via super()."""
    owner_name, _, attr = patch.target.partition(".")
    owner = getattr(module, owner_name, None)
    if not attr or "." in attr or not isinstance(owner, type):
        return []
    found, todo = [], list(owner.__subclasses__())
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if attr in vars(cls):
            found.append(f"{cls.__module__}.{cls.__qualname__}")
    return sorted(set(found))


def _resolve(patch: Patch, module: ModuleType) -> None:
    _states[patch.id].module = module
    try:
        target = _resolve_target(module, patch.target)
    except AttributeError:
        _set(patch, TARGET_MISSING, f"{patch.module}.{patch.target} does not exist in this release")
        return
    foreign = _foreign_owner(patch, module)
    if foreign:
        # Its methods were rebuilt from TRL's source by someone else: wrapping
        # them again would patch twice, or patch code we never probed.
        _set(patch, CONFLICT, f"{patch.module}.{patch.target.split('.')[0]} was replaced by {foreign}; left alone")
        return
    try:
        verdict = patch.probe(module)
    except SourceUnavailable as exc:
        _set(patch, UNDECIDED, str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - a probe must never break the host
        _set(patch, FAILED, f"probe raised {type(exc).__name__}: {exc}")
        return
    if verdict.needed is None:
        _set(patch, UNDECIDED, verdict.reason)
        return
    if not verdict.needed:
        _set(patch, NOT_NEEDED, verdict.reason)
        return
    if patch.opt_in and not switched_on(patch.opt_in):
        log.info("trl_compat: %s: %s; opt-in: set %s=1 to apply the fix", patch.id, verdict.reason, patch.opt_in)
        _set(patch, DISABLED, f"opt-in, off: {verdict.reason}; set {patch.opt_in}=1 to apply the fix")
        return
    patcher = Patcher(patch.id)
    try:
        patch.apply(module, patcher)
    except AlreadyPatched as exc:
        # Another copy of trl_compat (vendored and installed, or reloaded): never wrap twice.
        patcher.undo()
        _set(patch, APPLIED, f"already patched by another copy of trl_compat ({exc})")
        return
    except Exception as exc:  # noqa: BLE001
        patcher.undo()
        _set(patch, FAILED, f"apply raised {type(exc).__name__}: {exc}; changes rolled back")
        return
    state = _states[patch.id]
    state.patcher, state.touched, state.changed = patcher, patcher.touched(), patcher.changed()
    _set(patch, APPLIED, verdict.reason)


def revert(*ids: str) -> None:
    """Undo the given patches (default: all), newest first, and neutralise
    their hooks that have not fired yet. ``install()`` re-applies.

    A patch stacked above one of them (it wraps the same attribute) comes off
    first and is applied again afterwards, on what is left: undoing only the
    lower one would leave it half in place under the upper one."""
    with _lock:
        chosen = _select(ids)
        above = _stacked_above(chosen)
        for patch in sorted(_unique(chosen + above), key=_position, reverse=True):
            _take_off(patch, "reverted by trl_compat.revert()")
    if above:
        install(*(p.id for p in above))


def _position(patch: Patch) -> int:
    return list(_registry).index(patch.id)


def _unique(patches: List[Patch]) -> List[Patch]:
    return list({p.id: p for p in patches}.values())


def _take_off(patch: Patch, reason: str) -> None:
    state = _states[patch.id]
    state.generation += 1
    if state.patcher is not None:
        state.patcher.undo()
        state.patcher = None
        state.status, state.reason = REVERTED, reason
    elif state.status == PENDING:
        state.status, state.reason = REVERTED, "reverted before its trigger module was imported"


def _stacked_above(moving: List[Patch]) -> List[Patch]:
    """Applied patches, other than ``moving``, registered after one of them and
    changing an attribute it changes (or changed when last applied), and in
    turn those above them. A moving patch never applied yet may change anything
    of its trigger module: every later patch applied there counts as above it
    (taking one off and on again costs a re-wrap; wrapping above it would not
    stack in registration order)."""
    moving_ids = {p.id for p in moving}
    below = [(_position(p), _states[p.id].touched, None if _states[p.id].touched else p.module) for p in moving]
    above: List[Patch] = []
    grew = True
    while grew:
        grew = False
        for patch in registry():
            state = _states[patch.id]
            if patch.id in moving_ids or patch in above or state.patcher is None:
                continue
            if any(pos < _position(patch) and (state.touched & touched or module == patch.module)
                   for pos, touched, module in below):
                above.append(patch)
                below.append((_position(patch), state.touched, None))
                grew = True
    return above


def _log_summary_when_settled() -> None:
    if any(s.status == PENDING for s in _states.values()):
        return
    applied = [pid for pid, s in _states.items() if s.status == APPLIED]
    trouble = [f"{pid} ({s.status})" for pid, s in _states.items() if s.status in _TROUBLE]
    others = len(_states) - len(applied) - len(trouble)
    log.info(
        "trl_compat: applied %s; %d not needed or disabled%s (details: python -m trl_compat)",
        ", ".join(applied) or "nothing", others,
        f"; skipped: {', '.join(trouble)}" if trouble else "",
    )


def _reason_now(patch: Patch, state: _State) -> str:
    """The recorded reason, plus what has changed around an applied patch since."""
    reason = state.reason
    if state.status != APPLIED or state.module is None:
        return reason
    foreign = _foreign_owner(patch, state.module)
    if foreign:
        reason += f"; but {patch.target.split('.')[0]} has since been replaced by {foreign}, which the patch does not reach"
    overriding = _overriding_subclasses(patch, state.module)
    if overriding:
        reason += (f"; overridden in {', '.join(overriding)}: the fix reaches those only through super()")
    return reason


def report() -> List[PatchStatus]:
    with _lock:
        return [
            PatchStatus(
                id=p.id, status=_states[p.id].status, reason=_reason_now(p, _states[p.id]),
                versions=dict(_states[p.id].versions),
                target=", ".join(_states[p.id].changed) or f"{p.module}.{p.target}",
                summary=p.summary, upstream=p.upstream,
            )
            for p in _registry.values()
        ]


def status(patch_id: str) -> str:
    return _states[patch_id].status


def applied() -> List[str]:
    with _lock:
        return [pid for pid, s in _states.items() if s.status == APPLIED]


def unregister(patch_id: str) -> None:
    """Revert and forget a patch (for tests that register their own)."""
    with _lock:
        if patch_id in _registry:
            revert(patch_id)
            del _registry[patch_id]
            del _states[patch_id]
