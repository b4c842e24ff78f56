"""Start-up hook of trl-compat's ``TRL_COMPAT_AUTO`` switch, called by ``trl_compat.pth`` (and,
from Python 3.15 on, by ``trl_compat.start``, PEP 829), both in site-packages.

A top-level module shipped at the wheel's root, not a part of the ``trl_compat`` package,
because importing any ``trl_compat.*`` module runs ``trl_compat/__init__`` (which installs
the patches), while ``trl_compat.start``'s entry point is called at every interpreter start,
switch on or off. Standard library only, plain syntax.
"""

import os
import sys

VARIABLE = "TRL_COMPAT_AUTO"
# The same values as trl_compat/_engine/settings.py's ON and OFF (this module cannot import it).
ON_VALUES = ("1", "true", "yes", "on")
OFF_VALUES = ("0", "false", "no", "off", "")

_started = False
warned = None  # the unrecognised value warned about; trl_compat's own check does not repeat it


def switch_on(environ=None):
    environ = os.environ if environ is None else environ
    return environ.get(VARIABLE, "").strip().lower() in ON_VALUES


def start():
    """Activate trl_compat in this process if ``TRL_COMPAT_AUTO`` is on; warn on stderr about a
    value that is neither on nor off (taken as off). Never raises."""
    global _started, warned
    if _started:
        return
    if not switch_on():
        raw = os.environ.get(VARIABLE, "")
        if raw.strip().lower() not in OFF_VALUES and warned is None:
            warned = raw
            try:
                sys.stderr.write(
                    f"trl_compat: warning: {VARIABLE}={raw!r} is not a recognised value (on: {', '.join(ON_VALUES)}; "
                    f"off: {', '.join(OFF_VALUES[:-1])} or unset); assumed off\n"
                )
            except Exception:  # noqa: BLE001 - no stderr: nothing to warn on
                pass
        return
    _started = True
    try:
        if _defer_to_end_of_site():
            return
    except Exception:  # noqa: BLE001 - a site.py we do not know: activate now rather than never
        pass
    activate()


def activate():
    try:
        import trl_compat.activation
    except Exception as err:  # noqa: BLE001 - a broken trl_compat must not stop the interpreter
        sys.stderr.write(
            f"trl_compat: {VARIABLE}={os.environ.get(VARIABLE)} is set, but {sys.executable} could not import trl_compat "
            f"({err.__class__.__name__}: {err}); this process runs without its fixes\n"
        )
        return
    trl_compat.activation.activate(trl_compat.activation.SWITCHED)


def _defer_to_end_of_site():
    """Called from a ``.pth`` file, i.e. in the middle of ``site.main()`` (before Python 3.15):
    directories listed after ours, a venv's system site-packages and the user's site are
    not on ``sys.path`` yet, so trl_compat's version gate would not see a trl installed
    there. Run ``activate()`` after site's last step instead (autowrapt's way). Returns
    False when not called from ``site.main()``: then activate now."""
    site = sys.modules.get("site")
    main_code = getattr(getattr(site, "main", None), "__code__", None)
    frame = sys._getframe(1)
    while frame is not None and frame.f_code is not main_code:
        frame = frame.f_back
    if frame is None or main_code is None:
        return False
    name = "execusercustomize" if getattr(site, "ENABLE_USER_SITE", False) else "execsitecustomize"
    original = getattr(site, name, None)
    if original is None:
        return False

    def last_step(*args, **kwargs):
        setattr(site, name, original)
        try:
            return original(*args, **kwargs)
        finally:
            activate()

    setattr(site, name, last_step)
    return True
