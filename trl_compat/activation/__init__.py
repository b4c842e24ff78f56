"""Zero-code activation: trl_compat in every Python process of a run, with no ``import trl_compat``.

Two ways in (README, "Zero-code activation"):

* ``trl-compat run -- CMD [ARGS...]`` (:mod:`trl_compat.activation.launcher`) runs CMD with
  :data:`BOOTSTRAP_DIR` first on ``PYTHONPATH``. Its ``sitecustomize`` runs the one it shadows,
  then imports trl_compat, in every interpreter that inherits that environment.
* ``TRL_COMPAT_AUTO=1`` (:data:`SWITCH`) with the wheel's ``trl_compat.pth`` and
  ``trl_compat.start`` in site-packages: they call ``_trl_compat_auto.start()`` (a top-level
  module, see ``site_files/_trl_compat_auto.py``), which imports trl_compat once ``site`` has
  put every directory on ``sys.path``.

Both end in :func:`activate`, which records how this process got trl_compat;
:func:`describe` is what ``python -m trl_compat`` reports about it.
"""

from __future__ import annotations

import os
import site
import sys

from trl_compat._engine import logs, settings

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SWITCH = settings.AUTO
ON_VALUES = settings.ON
PTH_FILE = "trl_compat.pth"
START_FILE = "trl_compat.start"
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")

LAUNCHER = "launcher"
SWITCHED = "switch"
IMPORTED = "import"

_how: str | None = None


def activate(how: str) -> None:
    """Called at interpreter start-up by the launcher's ``sitecustomize`` or the switch, once
    ``trl_compat`` (the package, whose import installs the patches) is imported. The first
    caller wins (with both on, the launcher: the switch waits for the end of ``site``)."""
    global _how
    if _how is None:
        _how = how
        logs.getLogger(__name__).debug("trl_compat: activated at start-up by the %s", how)


def this_process() -> str:
    """How this process got trl_compat: ``"launcher"``, ``"switch"`` or ``"import"`` (its own code)."""
    return _how or IMPORTED


def switch_on(environ: Mapping[str, str] | None = None) -> bool:
    # No warning here: an unrecognised value was already told at start-up, by the .pth's
    # _trl_compat_auto, in every process that inherited it.
    return settings.is_on(SWITCH, environ)


def same_path(a: str, b: str) -> bool:
    return os.path.normcase(os.path.realpath(a or os.curdir)) == os.path.normcase(os.path.realpath(b or os.curdir))


def is_bootstrap_dir(path: str) -> bool:
    """This trl_compat's bootstrap directory, or another copy's (a source tree next to an install)."""
    if not path:
        return False
    if same_path(path, BOOTSTRAP_DIR):
        return True
    tail = os.path.join("trl_compat", "activation", "bootstrap")
    return os.path.normpath(path).endswith(os.sep + tail) and os.path.isfile(os.path.join(path, "sitecustomize.py"))


def launcher_on_pythonpath(environ: Mapping[str, str] | None = None) -> bool:
    environ = os.environ if environ is None else environ
    return any(is_bootstrap_dir(entry) for entry in environ.get("PYTHONPATH", "").split(os.pathsep))


def site_dirs() -> list[str]:
    """The directories whose ``.pth`` files this interpreter processes at start-up."""
    dirs: list[str] = []
    try:
        dirs.extend(site.getsitepackages())
    except AttributeError:  # old virtualenv's site.py
        pass
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return dirs


def installed_site_files(name: str = PTH_FILE) -> list[str]:
    return [os.path.join(d, name) for d in site_dirs() if os.path.isfile(os.path.join(d, name))]


def describe(environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """Whether trl_compat is active automatically here, how, and how this process got it."""
    environ = os.environ if environ is None else environ
    pth, start = installed_site_files(PTH_FILE), installed_site_files(START_FILE)
    switch = {
        "variable": SWITCH,
        "value": environ.get(SWITCH),
        "on": switch_on(environ),
        "pth": pth,
        "start": start,
        "problem": settings.switch_problem(SWITCH, environ),
    }
    launcher = {"bootstrap": BOOTSTRAP_DIR, "on_pythonpath": launcher_on_pythonpath(environ)}
    mechanisms = []
    if launcher["on_pythonpath"]:
        mechanisms.append(LAUNCHER)
    if switch["on"] and pth:
        mechanisms.append(SWITCHED)
    how = {
        LAUNCHER: "started under `trl-compat run` (its bootstrap directory is on PYTHONPATH)",
        SWITCHED: f"{SWITCH}={environ.get(SWITCH)} with {pth[0] if pth else ''}",
    }
    if mechanisms:
        summary = (
            "automatic: "
            + " and ".join(how[m] for m in mechanisms)
            + ": every Python process started with this environment imports trl_compat at start-up"
        )
    elif switch["on"]:
        summary = (
            f"not automatic: {SWITCH}={environ.get(SWITCH)} but {PTH_FILE} is in none of this interpreter's "
            "site-packages directories (an editable or --target install?): use `trl-compat run -- CMD` "
            "or `import trl_compat`"
        )
    elif switch["problem"]:
        summary = f"not automatic: {switch['problem']}"
    else:
        summary = (
            f"not automatic: only scripts that `import trl_compat` get the fixes; set {SWITCH}=1 or "
            "start the run with `trl-compat run -- CMD`"
        )
    summary += {
        LAUNCHER: " (this process: by the launcher)",
        SWITCHED: f" (this process: by {SWITCH})",
        IMPORTED: " (this process: by its own import)",
    }[this_process()]
    return {
        "automatic": bool(mechanisms),
        "mechanisms": mechanisms,
        "this_process": this_process(),
        "switch": switch,
        "launcher": launcher,
        "python_flags": {"no_site": bool(sys.flags.no_site), "ignore_environment": bool(sys.flags.ignore_environment)},
        "summary": summary,
    }
