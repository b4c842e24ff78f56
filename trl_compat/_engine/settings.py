"""The ``TRL_COMPAT_*`` environment variables: the one place they are read and checked.

A switch (``TRL_COMPAT_AUTO``, ``TRL_COMPAT_STRICT``, ``TRL_COMPAT_QUIET``, a patch's opt-in
variable) is on for ``1``/``true``/``yes``/``on`` and off for ``0``/``false``/``no``/``off`` or
unset, in any case and with spaces around. Anything else would otherwise be silently off, and a
user who wrote ``TRL_COMPAT_STRICT=enabled`` would believe strict mode on: such a value is taken
as off, and said so on stderr once per process (and variable and value), naming the accepted
values. ``TRL_COMPAT_DISABLE`` is a comma-separated list of patch ids, or ``*``; ids that no
patch has are ignored, and said so the same way. :func:`problems` is what ``python -m
trl_compat`` reports.

stderr, not :mod:`logging`: the switch is read at interpreter start-up, before any script could
have configured logging (and importing it there would cost a third of starting Python).
``activation/site_files/_trl_compat_auto.py`` keeps its own copy of the accepted values: it must
run without importing trl_compat.
"""

from __future__ import annotations

import _thread
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import Callable

AUTO = "TRL_COMPAT_AUTO"
STRICT = "TRL_COMPAT_STRICT"
QUIET = "TRL_COMPAT_QUIET"
DISABLE = "TRL_COMPAT_DISABLE"
GUARD = "TRL_COMPAT_GUARD"

ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off", "")

# What each switch does, for the report (opt-in variables come from the registry).
SWITCHES = {
    AUTO: "import trl_compat at every interpreter start-up (with the wheel's trl_compat.pth)",
    STRICT: "raise TrlCompatError instead of skipping a patch that may be needed",
    QUIET: "no trl_compat line in the training log",
}

# TRL_COMPAT_GUARD: the off-policy guard (trl_compat.guard): a switch, or "strict"
GUARD_STRICT = "strict"
GUARD_DOES = 'the off-policy guard: checks that vLLM generated what the loss trains on ("strict": an alarm raises OffPolicyError)'

_lock = _thread.allocate_lock()
_warned: set[tuple] = set()
_holds: list[Callable[[], bool]] = []


def _environ(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def switch_problem(variable: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Why the switch's value is not one of the accepted ones, and what is assumed; None if it is."""
    raw = _environ(environ).get(variable)
    if raw is None or raw.strip().lower() in ON + OFF:
        return None
    return f"{variable}={raw!r} is not a recognised value (on: {', '.join(ON)}; off: {', '.join(OFF[:-1])} or unset); assumed off"


def is_on(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the switch ``variable`` is on, without a warning (for the report)."""
    return _environ(environ).get(variable, "").strip().lower() in ON


def switch(variable: str, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the switch ``variable`` is on; an unrecognised value is off, with a warning."""
    if is_on(variable, environ):
        return True
    raw = _environ(environ).get(variable, "")
    problem = switch_problem(variable, environ)
    # The .pth's start-up module has said it already in this process (same words).
    told = variable == AUTO and getattr(sys.modules.get("_trl_compat_auto"), "warned", None) == raw
    if problem and not told:
        _warn_once((variable, raw), problem)
    return False


def guard_mode(environ: Mapping[str, str] | None = None) -> str:
    """``TRL_COMPAT_GUARD``: "off", "on" or "strict"; an unrecognised value is off, with a warning."""
    raw = _environ(environ).get(GUARD, "").strip().lower()
    if raw == GUARD_STRICT:
        return "strict"
    if raw in ON:
        return "on"
    problem = guard_problem(environ)
    if problem:
        _warn_once((GUARD, raw), problem)
    return "off"


def guard_problem(environ: Mapping[str, str] | None = None) -> str | None:
    raw = _environ(environ).get(GUARD)
    if raw is None or raw.strip().lower() in ON + OFF + (GUARD_STRICT,):
        return None
    return (
        f"{GUARD}={raw!r} is not a recognised value (on: {', '.join(ON)}; {GUARD_STRICT}: on, and an alarm "
        f"raises; off: {', '.join(OFF[:-1])} or unset); assumed off"
    )


def disabled_ids(known: Iterable[str], environ: Mapping[str, str] | None = None) -> set[str]:
    """The ids ``TRL_COMPAT_DISABLE`` names (``*``: every patch); unknown ones warn and are kept
    (they match nothing)."""
    raw = _environ(environ).get(DISABLE, "")
    ids = {part.strip() for part in raw.split(",") if part.strip()}
    problem = disable_problem(known, environ)
    if problem:
        _warn_once((DISABLE, raw), problem)
    return ids


def disable_problem(known: Iterable[str], environ: Mapping[str, str] | None = None) -> str | None:
    raw = _environ(environ).get(DISABLE, "")
    known = sorted(known)
    unknown = sorted({part.strip() for part in raw.split(",") if part.strip()} - set(known) - {"*"})
    if not unknown:
        return None
    return (
        f"{DISABLE} names unknown patch id{'s' if len(unknown) > 1 else ''} "
        f"{'; '.join(close_matches(pid, known) for pid in unknown)} (accepted: a comma-separated list of "
        "patch ids, as `python -m trl_compat` lists them, or *); assumed: ignored"
    )


def close_matches(unknown: str, known: Iterable[str]) -> str:
    """``unknown``, and the known ids it was probably meant to be (``'pad_token' (did you mean
    pad-token?)``): a typo gets the one or two likely ids, not the whole registry."""
    import difflib  # only when a value is wrong: start-up stays cheap

    known = list(known)
    normalised = {pid.replace("-", "_").lower(): pid for pid in known}
    guesses = [
        normalised[key] for key in difflib.get_close_matches(unknown.replace("-", "_").lower(), list(normalised), n=2, cutoff=0.6)
    ]
    guesses += [pid for pid in known if unknown.lower() in pid and pid not in guesses][: max(0, 2 - len(guesses))]
    if not guesses:
        return repr(unknown)
    return f"{unknown!r} (did you mean {' or '.join(guesses)}?)"


def problems(known: Iterable[str], opt_in: Iterable[str], environ: Mapping[str, str] | None = None) -> dict[str, dict[str, object]]:
    """Every ``TRL_COMPAT_*`` variable trl_compat reads that is set: ``{variable: {"value", "problem"}}``
    (``problem``: None, or what :func:`switch`/:func:`disabled_ids` warn)."""
    env = _environ(environ)
    found: dict[str, dict[str, object]] = {}
    for variable in sorted(set(SWITCHES) | set(opt_in) | {DISABLE, GUARD}):
        if variable not in env:
            continue
        if variable == DISABLE:
            problem = disable_problem(known, env)
        elif variable == GUARD:
            problem = guard_problem(env)
        else:
            problem = switch_problem(variable, env)
        found[variable] = {"value": env[variable], "problem": problem}
    return found


def strict() -> bool:
    """``TRL_COMPAT_STRICT`` is on and no hold (:func:`hold_strict_when`) applies right now."""
    return switch(STRICT) and not any(held() for held in _holds)


def hold_strict_when(predicate: Callable[[], bool]) -> None:
    """While ``predicate()`` is true, a failure is not raised where it happens (it is still
    recorded, and logged): whoever registered the hold raises it later, where it reaches the user
    as it is rather than wrapped in another library's error."""
    if predicate not in _holds:
        _holds.append(predicate)


def check(known: Iterable[str], opt_in: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
    """Warn (once) about every variable set to a value it does not accept, read or not yet."""
    for variable in sorted(set(SWITCHES) | set(opt_in)):
        switch(variable, environ)
    disabled_ids(known, environ)
    guard_mode(environ)


def _warn_once(key: tuple, message: str) -> None:
    with _lock:
        if key in _warned:
            return
        _warned.add(key)
    try:
        sys.stderr.write(f"trl_compat: warning: {message}\n")
    except Exception:  # noqa: BLE001 - no stderr (pythonw, closed): nothing to warn on
        pass
