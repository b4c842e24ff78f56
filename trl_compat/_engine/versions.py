"""The version gate: which installed versions a patch's bug can be in.

It runs for every patch in every process that imports trl_compat, so it imports neither
``importlib.metadata`` nor ``packaging`` where it can do without: versions are read from the
``*.dist-info``/``*.egg-info`` directories on ``sys.path`` (as ``importlib.metadata`` finds
them), and compared by :mod:`trl_compat._engine.pep440`. Whatever is out of the ordinary
(a zipped ``sys.path`` entry, an egg, another distribution finder, a local label, a
pre-release of a window's own bound) goes to ``importlib.metadata`` and ``packaging``.
"""

from __future__ import annotations

import os
import sys

from trl_compat._engine import pep440
from trl_compat._engine.patch import FAILED, NOT_NEEDED, UNKNOWN_VERSION

TYPE_CHECKING = False
if TYPE_CHECKING:
    from trl_compat._engine.patch import Patch

_ASK_IMPORTLIB = object()


def dist_version(dist: str) -> str | None:
    """The installed version of a distribution, without importing it."""
    found = _scan(dist)
    if found is not _ASK_IMPORTLIB:
        return found
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _normalise(name: str) -> str:
    """PEP 503's name normalisation (runs of ``-_.`` to one ``_``, lower case), without ``re``."""
    name = name.lower().replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name


def _scan(dist: str):
    """What ``importlib.metadata.version(dist)`` returns, read the way it reads it (the first
    matching ``*.dist-info``/``*.egg-info`` along ``sys.path``), or ``_ASK_IMPORTLIB``."""
    for finder in sys.meta_path:
        if getattr(finder, "find_distributions", None) and getattr(finder, "__name__", "") != "PathFinder":
            return _ASK_IMPORTLIB  # another source of distributions: let importlib.metadata ask it
    wanted = _normalise(dist)
    for entry in sys.path:
        if not isinstance(entry, str) or entry.lower().endswith(".egg"):
            return _ASK_IMPORTLIB  # an egg on sys.path: its EGG-INFO is read another way
        try:
            infos = _infos(entry or ".")
        except NotADirectoryError:
            return _ASK_IMPORTLIB  # a zip on sys.path
        except OSError:
            continue
        if wanted in infos:
            return _metadata_version(os.path.join(entry or ".", infos[wanted]))
    return None


_listings: dict[str, tuple] = {}  # sys.path entry -> (mtime, {normalised name: first metadata dir})


def _infos(directory: str) -> dict[str, str]:
    mtime = os.stat(directory).st_mtime
    cached = _listings.get(directory)
    if cached is None or cached[0] != mtime:
        infos: dict[str, str] = {}
        for child in os.listdir(directory):
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                infos.setdefault(_normalise(low.rpartition(".")[0].partition("-")[0]), child)
        cached = _listings[directory] = (mtime, infos)
    return cached[1]


def _metadata_version(path: str):
    files = [path] if os.path.isfile(path) else [os.path.join(path, "METADATA"), os.path.join(path, "PKG-INFO")]
    for name in files:
        try:
            with open(name, encoding="utf-8") as handle:
                for line in handle:
                    if not line.strip():
                        break  # the headers end at the first empty line
                    key, sep, value = line.partition(":")
                    if sep and key.strip().lower() == "version":
                        return value.strip()
            return None
        except FileNotFoundError:
            continue
        except (OSError, UnicodeDecodeError):
            return _ASK_IMPORTLIB
    return None


def _importable_without_metadata(dist: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(dist.replace("-", "_")) is not None
    except (ImportError, ValueError):
        return False


def affected(since: str, fixed_in: str | None = None) -> str:
    """The version window of a bug present from release ``since`` up to the release
    ``fixed_in`` (exclusive; None: not fixed in any release trl_compat knows).

    Both ends hold the main-branch builds around them: ``X.dev0`` installs come
    before release X under PEP 440, so ``>=since.dev0``; and the fix lands somewhere
    among the ``fixed_in`` dev builds, which ``<fixed_in`` would leave out, so the
    window ends before ``fixed_in``'s first alpha. Which dev builds hold the bug is
    the probe's to tell, from the code."""
    lower = _parse(since)
    spec = f">={lower.base_version}.dev0" if lower.pre is None and lower.dev is None else f">={since}"
    if fixed_in is not None:
        spec += f",<{_parse(fixed_in).base_version}a0"
    return spec


def _parse(text: str):
    """``text`` parsed; packaging's Version (and its InvalidVersion) for what pep440 does not parse."""
    parsed = pep440.parse(text)
    if parsed is None:
        from packaging.version import Version

        return Version(text)
    return parsed


def gate(patch: Patch):
    """Return ``(status or None, reason, versions)``; ``None`` means in window."""
    versions: dict[str, str | None] = {}
    for dist, spec in patch.requires.items():
        raw = dist_version(dist)
        versions[dist] = raw
        if raw is None:
            if _importable_without_metadata(dist):
                return (UNKNOWN_VERSION, f"{dist} is importable but has no distribution metadata, so its version is unknown", versions)
            return NOT_NEEDED, f"{dist} is not installed", versions
        parsed = pep440.parse(raw)
        inside = None if parsed is None else pep440.contains(spec, parsed)
        if inside is None:
            status, inside = _ask_packaging(dist, raw, spec)
            if status is not None:
                return status, inside, versions
        if not inside:
            return NOT_NEEDED, f"{dist} {raw} is outside the affected window {spec}", versions
    return None, "", versions


def _ask_packaging(dist: str, raw: str, spec: str):
    """``(None, inside)``, or ``(status, reason)`` where the version or the window is invalid."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        version = Version(raw)
    except InvalidVersion:
        return UNKNOWN_VERSION, f"{dist} reports version {raw!r}, which is not a PEP 440 version"
    try:
        window = SpecifierSet(spec, prereleases=True)
    except InvalidSpecifier:  # a bug of ours; never the user's problem
        return FAILED, f"invalid version window {spec!r} for {dist}"
    return None, window.contains(version)
