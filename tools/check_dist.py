"""Check the sdist and the wheel that ``python -m build`` wrote: metadata and contents.

What ``twine check --strict`` does not look at: the name, the version (the one in
``trl_compat/__init__.py``), the dependencies (no extras that would upgrade a pinned stack),
the console script, that the wheel carries every module of the tree and, at its root (i.e.
in site-packages once installed), the ``TRL_COMPAT_AUTO`` start-up files, byte for byte; and
that the sdist carries README, CHANGELOG, LICENSE, the docs README links and the whole test suite.

usage: python tools/check_dist.py DIST_DIR      (tox -e package runs it)
"""

import ast
import email
import os
import sys
import tarfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAME = "trl-compat"
REQUIRES = {"packaging>=20"}
EXTRAS = {"test"}  # no vllm/deepspeed/peft extras: they would pull the newest releases
CONSOLE_SCRIPT = "trl-compat = trl_compat.__main__:main"
SITE_FILES = ("trl_compat.pth", "trl_compat.start", "_trl_compat_auto.py")
SITE_FILES_DIR = os.path.join("trl_compat", "activation", "site_files")
SDIST_FILES = ("README.md", "CHANGELOG.md", "LICENSE", "setup.cfg", "setup.py", "pyproject.toml")


def tree_files(top, suffixes=None):
    """Files under ROOT/top (relative, '/'-separated), without caches."""
    found = set()
    for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
        dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.endswith(".egg-info")]
        for name in filenames:
            if name.endswith((".pyc", ".pyo")) or (suffixes and not name.endswith(suffixes)):
                continue
            found.add(os.path.relpath(os.path.join(dirpath, name), ROOT).replace(os.sep, "/"))
    return found


def source_version():
    tree = ast.parse(open(os.path.join(ROOT, "trl_compat", "__init__.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__version__" for t in node.targets):
            return ast.literal_eval(node.value)
    raise SystemExit("no __version__ in trl_compat/__init__.py")


def check_metadata(meta, where, problems):
    version = source_version()
    if meta["Name"] != NAME:
        problems.append(f"{where}: Name {meta['Name']!r}, expected {NAME!r}")
    if meta["Version"] != version:
        problems.append(f"{where}: Version {meta['Version']!r}, expected {version!r} (trl_compat.__version__)")
    if not meta.get("Requires-Python"):
        problems.append(f"{where}: no Requires-Python")
    requires = set(meta.get_all("Requires-Dist") or ())
    plain = {r for r in requires if "extra ==" not in r}
    if plain != REQUIRES:
        problems.append(f"{where}: Requires-Dist {sorted(plain)}, expected {sorted(REQUIRES)}")
    extras = set(meta.get_all("Provides-Extra") or ())
    if extras != EXTRAS:
        problems.append(f"{where}: Provides-Extra {sorted(extras)}, expected {sorted(EXTRAS)}")
    if meta.get("Description-Content-Type") != "text/markdown" or "trl" not in (meta.get_payload() or ""):
        problems.append(f"{where}: the long description is not README.md as Markdown")


def check_wheel(path, problems):
    with zipfile.ZipFile(path) as zf:
        names = set(zf.namelist())
        (dist_info,) = {n.split("/")[0] for n in names if n.split("/")[0].endswith(".dist-info")}
        check_metadata(email.message_from_bytes(zf.read(f"{dist_info}/METADATA")), os.path.basename(path), problems)
        entry_points = zf.read(f"{dist_info}/entry_points.txt").decode()
        if "[console_scripts]" not in entry_points or CONSOLE_SCRIPT not in entry_points:
            problems.append(f"wheel: console script {CONSOLE_SCRIPT!r} missing from entry_points.txt")
        for name in SITE_FILES:
            if name not in names:
                problems.append(f"wheel: {name} is not at the wheel's root (site-packages)")
            elif zf.read(name) != open(os.path.join(ROOT, SITE_FILES_DIR, name), "rb").read():
                problems.append(f"wheel: {name} differs from {SITE_FILES_DIR}/{name}")
        modules = {f for f in tree_files("trl_compat", (".py",)) if not f.startswith(SITE_FILES_DIR + "/")}
        missing = modules - names
        if missing:
            problems.append(f"wheel: modules of the tree missing: {sorted(missing)}")
        stray = sorted(n for n in names if n.split("/")[0] in ("tests", "benchmarks", "matrix", "examples"))
        if stray:
            problems.append(f"wheel: carries files that are not the package: {stray[:5]}")
    return len(names)


def check_sdist(path, problems):
    with tarfile.open(path) as tf:
        members = tf.getnames()
        top = members[0].split("/")[0]
        names = {m.split("/", 1)[1] for m in members if "/" in m}
        check_metadata(email.message_from_bytes(tf.extractfile(f"{top}/PKG-INFO").read()), os.path.basename(path), problems)
    wanted = set(SDIST_FILES) | tree_files("tests") | tree_files("docs") | tree_files("trl_compat", (".py",))
    wanted |= {f"{SITE_FILES_DIR}/{n}".replace(os.sep, "/") for n in SITE_FILES}
    missing = wanted - names
    if missing:
        problems.append(f"sdist: missing {len(missing)} files: {sorted(missing)[:8]}")
    caches = sorted(n for n in names if "__pycache__" in n or n.endswith(".pyc"))
    if caches:
        problems.append(f"sdist: carries caches: {caches[:5]}")
    return len(names)


def main(argv):
    if len(argv) != 2:
        raise SystemExit(__doc__)
    dist = argv[1]
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    sdists = [f for f in os.listdir(dist) if f.endswith(".tar.gz")]
    if len(wheels) != 1 or len(sdists) != 1:
        raise SystemExit(f"expected one wheel and one sdist in {dist}, found {wheels + sdists}")
    problems = []
    n_wheel = check_wheel(os.path.join(dist, wheels[0]), problems)
    n_sdist = check_sdist(os.path.join(dist, sdists[0]), problems)
    for problem in problems:
        print("FAIL", problem)
    if problems:
        return 1
    print(f"ok: {wheels[0]} ({n_wheel} files), {sdists[0]} ({n_sdist} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
