"""What a patch is: its declaration, what its probe may say, the statuses it can be in.

Plain classes with ``__slots__`` and keyword ``__init__``, not dataclasses: this runs at
interpreter start-up, where ``dataclasses`` (and the ``inspect`` it imports) would cost more
than trl_compat's own code."""

from __future__ import annotations

import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from types import ModuleType
    from typing import Any, Callable

    from trl_compat._engine.patcher import Patcher

    Probe = Callable[[ModuleType], "Verdict"]
    Apply = Callable[[ModuleType, Patcher], None]

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

# A patch's kind: a fix applies where its probe finds the bug; advice never applies (no fix here
# could be proved): where its probe finds the bug it says "undecided", with the upgrade to make.
FIX = "fix"
ADVICE = "advice"
KINDS = (FIX, ADVICE)

# The defaults most entries share: the GRPO trainer's module and its class.
GRPO_MODULE = "trl.trainer.grpo_trainer"
GRPO_TRAINER = "GRPOTrainer"
PATCHES_PACKAGE = "trl_compat.patches"


class TrlCompatError(RuntimeError):
    """Raised instead of degrading quietly when ``TRL_COMPAT_STRICT=1``."""

    __module__ = "trl_compat"  # where users import it from: tracebacks name the public path


class SourceUnavailable(LookupError):
    """The source of the probed object cannot be read; the message says why (the patch is "undecided")."""


class Verdict(tuple):
    """What a probe found: ``(needed, reason)``; ``needed`` is True, False, or None (cannot tell)."""

    __slots__ = ()

    def __new__(cls, needed: bool | None, reason: str) -> Verdict:
        return tuple.__new__(cls, (needed, reason))

    needed = property(lambda self: self[0])
    reason = property(lambda self: self[1])

    def __repr__(self) -> str:
        return f"Verdict(needed={self[0]!r}, reason={self[1]!r})"


def needed(reason: str) -> Verdict:
    return Verdict(True, reason)


def not_needed(reason: str) -> Verdict:
    return Verdict(False, reason)


def undecided(reason: str) -> Verdict:
    return Verdict(None, reason)


class _Fields:
    """Equality, ``repr`` and ``as_dict()`` over the fields a subclass names in ``__slots__``."""

    __slots__: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, _Fields) and other.as_dict() == self.as_dict()

    # Unhashable, as its dict fields are; mypy wants __hash__ to stay a method.
    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


class Patch(_Fields):
    """One patch, declared as data (``trl_compat/patches/__init__.py``): its whole declaration.

    - ``kind``: ``"fix"`` (the default) or ``"advice"``: never applied; its probe's "bug found"
      is reported as "undecided" (``trl_compat/patches/_advice.py``).
    - ``trigger``: the module whose import runs the patch (default: :data:`GRPO_MODULE`).
    - ``must_exist``: a dotted path inside ``trigger`` that must resolve before probing
      (default: ``"GRPOTrainer"``).
    - ``changes``: every attribute the patch may change, as dotted paths relative to ``trigger``
      (``"GRPOTrainer.__init__"``), or ``"module:Qual.name"`` for another module's attribute.
      ``Patcher.wrap``/``replace`` refuse anything else; patches whose ``changes`` overlap stack
      in registry order (:mod:`.targets`).
    - ``requires``: distribution -> PEP 440 window (``affected(since, fixed_in)``).
    - ``witnesses``: distribution -> ``{"inside": [...], "outside": [...]}``, versions the window
      tests feed through the gate.
    - ``summary`` (what the fix does), ``symptom`` (what a user sees without it: the error line or
      the silent effect, one line), ``upstream``, ``remove_when``.
    - ``fixed_in``: distribution -> the release that fixed the bug upstream (README's "fixed
      upstream"); ``{}``: no release has; None: not declared (README shows ``upstream``).
    - ``opt_in``: an environment variable that must be on for the patch to apply (a fix that
      changes the training objective; off, a patch whose probe finds the bug reports "disabled").
    - ``impl``: our module defining ``probe(module) -> Verdict`` and ``apply(module, patcher)``;
      it is imported only once the trigger module is, so that ``import trl_compat`` stays cheap.
      Default: ``trl_compat.patches.<id>``, dashes as underscores, dots dropped. Tests may give
      ``probe``/``apply`` as functions instead (then no ``impl`` is derived).

    A Patch is fixed once declared: ``replace(**fields)`` gives a changed copy."""

    __slots__: tuple[str, ...] = ("id", "kind", "summary", "symptom", "upstream", "fixed_in", "trigger", "must_exist", "changes")
    __slots__ += ("requires", "witnesses", "remove_when", "opt_in", "impl", "probe", "apply")

    id: str
    kind: str
    summary: str
    symptom: str
    upstream: str
    fixed_in: dict[str, str] | None
    trigger: str
    must_exist: str
    changes: tuple[str, ...]
    requires: dict[str, str]
    witnesses: dict[str, dict[str, list[str]]]
    remove_when: str
    opt_in: str
    impl: str
    probe: Probe | None
    apply: Apply | None

    def __init__(
        self,
        *,
        id: str,
        summary: str,
        upstream: str,
        requires: Mapping[str, str],
        changes: Iterable[str],
        trigger: str = GRPO_MODULE,
        must_exist: str = GRPO_TRAINER,
        kind: str = FIX,
        fixed_in: Mapping[str, str] | None = None,
        symptom: str = "",
        witnesses: Mapping[str, dict[str, list[str]]] | None = None,
        remove_when: str = "",
        opt_in: str = "",
        impl: str = "",
        probe: Probe | None = None,
        apply: Apply | None = None,
    ) -> None:
        self.id = id
        if kind not in KINDS:
            raise ValueError(f"patch {id!r}: kind={kind!r} is not one of {', '.join(KINDS)}")
        self.kind = kind
        self.summary = summary
        self.symptom = symptom
        self.upstream = upstream
        self.fixed_in = None if fixed_in is None else dict(fixed_in)
        self.trigger = trigger
        self.must_exist = must_exist
        self.changes = tuple(changes)
        if not self.changes:
            # what it changes decides its stacking and what its Patcher allows: never guessed
            raise ValueError(f"patch {id!r} declares no changes: list every attribute its apply may change")
        self.requires = dict(requires)
        self.witnesses = dict(witnesses or {})
        self.remove_when = remove_when
        self.opt_in = opt_in
        if not impl and probe is None and apply is None:
            impl = default_impl(id)
        self.impl = impl
        if impl:
            self.probe, self.apply = _Deferred(impl, "probe"), _Deferred(impl, "apply")
        else:
            self.probe, self.apply = probe, apply

    def __setattr__(self, name: str, value: object) -> None:
        if hasattr(self, name):
            raise AttributeError(f"a Patch is fixed once declared; use .replace({name}=...) for a changed copy")
        super().__setattr__(name, value)

    def replace(self, **changes: Any) -> Patch:
        """A copy with ``changes`` (field -> value). Given ``probe`` or ``apply``, the copy uses
        functions, not ``impl``: the other one is loaded from ``impl`` now."""
        values = dict(self.as_dict(), **changes)
        if "probe" in changes or "apply" in changes:
            values["impl"] = ""
            for name in ("probe", "apply"):
                values[name] = getattr(values[name], "function", values[name])
        elif self.impl:
            values["probe"] = values["apply"] = None
        return Patch(**values)


def default_impl(patch_id: str) -> str:
    """The module of the patch ``patch_id`` when its entry names none: ``"grpo-eval-0.14"`` ->
    ``"trl_compat.patches.grpo_eval_014"``."""
    return f"{PATCHES_PACKAGE}.{patch_id.replace('-', '_').replace('.', '')}"


class _Deferred:
    """``impl``'s function ``name``, imported at the first call."""

    __slots__ = ("impl", "name")

    def __init__(self, impl: str, name: str) -> None:
        self.impl, self.name = impl, name

    @property
    def function(self) -> Callable[..., Any]:
        __import__(self.impl)
        function: Callable[..., Any] = getattr(sys.modules[self.impl], self.name)
        return function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Deferred) and (other.impl, other.name) == (self.impl, self.name)

    __hash__ = None  # type: ignore[assignment]  # like the Patch that holds it

    def __repr__(self) -> str:
        return f"<{self.impl}.{self.name}, imported when called>"


class PatchStatus(_Fields):
    """One line of ``report()``: ``changes`` is what the patch declares it may change (absolute
    ``module:Qual.name``, known before its trigger module is imported); ``target`` what it changed
    when last applied (before that: its trigger module's ``must_exist``)."""

    __slots__ = ("id", "status", "reason", "versions", "target", "changes", "summary", "upstream")

    id: str
    status: str
    reason: str
    versions: dict[str, str | None]
    target: str
    changes: tuple[str, ...]
    summary: str
    upstream: str

    def __init__(
        self,
        *,
        id: str,
        status: str,
        reason: str,
        versions: Mapping[str, str | None] | None = None,
        target: str = "",
        changes: Iterable[str] = (),
        summary: str = "",
        upstream: str = "",
    ) -> None:
        self.id = id
        self.status = status
        self.reason = reason
        self.versions = dict(versions or {})
        self.target = target
        self.changes = tuple(changes)
        if not self.changes:
            # what it changes decides its stacking and what its Patcher allows: never guessed
            raise ValueError(f"patch {id!r} declares no changes: list every attribute its apply may change")
        self.summary = summary
        self.upstream = upstream
