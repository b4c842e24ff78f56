"""What a patch is: its declaration, what its probe may say, the statuses it can be in.

Plain classes, not dataclasses: this runs at interpreter start-up, where ``dataclasses`` (and
the ``inspect`` it imports) would cost more than trl_compat's own code."""

from __future__ import annotations

import sys

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


class TrlCompatError(RuntimeError):
    """Raised instead of degrading quietly when ``TRL_COMPAT_STRICT=1``."""


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


class _Record:
    """Fields, equality and ``repr`` from ``FIELDS`` (name -> default; ``...``: required)."""

    FIELDS: dict = {}

    def __init__(self, **values) -> None:
        unknown = set(values) - set(self.FIELDS)
        missing = [name for name, default in self.FIELDS.items() if default is ... and name not in values]
        if unknown or missing:
            raise TypeError(f"{type(self).__name__}: unknown fields {sorted(unknown)}, missing {missing}")
        for name, default in self.FIELDS.items():
            value = values.get(name, default)
            object.__setattr__(self, name, dict(value) if isinstance(value, dict) else value)

    def as_dict(self) -> dict:
        return {name: getattr(self, name) for name in self.FIELDS}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.as_dict() == self.as_dict()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"


class Patch(_Record):
    """One patch, declared as data (``trl_compat/patches/__init__.py``): its whole declaration.

    - ``trigger``: the module whose import runs the patch.
    - ``must_exist``: a dotted path inside ``trigger`` that must resolve before probing.
    - ``changes``: every attribute the patch may change, as dotted paths relative to ``trigger``
      (``"GRPOTrainer.__init__"``), or ``"module:Qual.name"`` for another module's attribute.
      ``Patcher.wrap``/``replace`` refuse anything else; patches whose ``changes`` overlap stack
      in registry order.
    - ``requires``: distribution -> PEP 440 window (``affected(since, fixed_in)``).
    - ``witnesses``: distribution -> ``{"inside": [...], "outside": [...]}``, versions the window
      tests feed through the gate.
    - ``summary`` (what the fix does), ``symptom`` (what a user sees without it: the error line or
      the silent effect, one line), ``upstream``, ``remove_when``.
    - ``opt_in``: an environment variable that must be on for the patch to apply (a fix that
      changes the training objective; off, a patch whose probe finds the bug reports "disabled").
    - ``impl``: our module defining ``probe(module) -> Verdict`` and ``apply(module, patcher)``;
      it is imported only once the trigger module is, so that ``import trl_compat`` stays cheap.
      Tests may give ``probe``/``apply`` as functions instead."""

    FIELDS = {"id": ..., "summary": ..., "upstream": ..., "trigger": ..., "must_exist": ..., "requires": ...,
              "probe": None, "apply": None, "impl": "", "remove_when": "", "opt_in": "",
              "changes": (), "witnesses": {}, "symptom": ""}

    def __init__(self, **values) -> None:
        super().__init__(**values)
        if self.impl:
            object.__setattr__(self, "probe", _Deferred(self.impl, "probe"))
            object.__setattr__(self, "apply", _Deferred(self.impl, "apply"))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"a Patch is fixed once declared; use .replace({name}=...) for a changed copy")

    def replace(self, **changes) -> Patch:
        values = dict(self.as_dict(), **changes)
        if "probe" in changes or "apply" in changes:
            values["impl"] = ""
            for name in ("probe", "apply"):
                values[name] = getattr(values[name], "function", values[name])
        elif self.impl:
            values["probe"] = values["apply"] = None
        return Patch(**values)


class _Deferred:
    """``code``'s function ``name``, imported at the first call."""

    def __init__(self, code: str, name: str) -> None:
        self.code, self.name = code, name

    @property
    def function(self):
        __import__(self.code)
        return getattr(sys.modules[self.code], self.name)

    def __call__(self, *args, **kwargs):
        return self.function(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.code}.{self.name}, imported when called>"


class PatchStatus(_Record):
    """One line of ``report()``."""

    FIELDS = {"id": ..., "status": ..., "reason": ..., "versions": {}, "target": "", "summary": "", "upstream": ""}
