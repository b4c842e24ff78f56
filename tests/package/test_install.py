"""The requirements lines a user pins (README, "Install"): the wheel and the sdist that
``tox -e package`` built, and a VCS URL pinned to a commit, each installed through a requirements
file into a fresh venv. Then the installed version is the tree's ``trl_compat.__version__``, the
console script and ``python -m trl_compat`` run, the start-up files sit at the site-packages root
(the switch works from there), and uninstalling takes them away.

Fast: no torch. ``--no-deps`` with the one dependency, packaging, listed in the file, and
``pip check`` to catch a dependency added without this test knowing.
Run by ``tox -e package``, which sets TRL_COMPAT_DIST to the folder it built the dists into."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = os.environ.get("TRL_COMPAT_DIST")

pytestmark = pytest.mark.skipif(not DIST, reason="run by `tox -e package`: needs the built sdist and wheel in TRL_COMPAT_DIST")


def _check_dist():
    """tools/check_dist.py: the tree's version and the start-up files, stated once."""
    spec = importlib.util.spec_from_file_location("check_dist", ROOT / "tools" / "check_dist.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


CHECK = _check_dist()
VERSION = CHECK.source_version()


def run(*cmd, cwd, env=None, timeout=300):
    out = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout}\n{out.stderr}"
    return out.stdout


def clean_env(**extra):
    # the venv's own python, not the tree: nothing on PYTHONPATH, no switch left on by the caller
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRL_COMPAT_AUTO", "PYTHONHOME")}
    env.update(extra)
    return env


def one(pattern):
    found = sorted(Path(DIST).glob(pattern))
    assert len(found) == 1, f"expected one {pattern} in {DIST}: {found}"
    return found[0]


def vcs_url(tmp_path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    commit = run("git", "rev-parse", "HEAD", cwd=ROOT).strip()
    clone = tmp_path / "clone"
    run("git", "clone", "--quiet", "--no-checkout", ROOT, clone, cwd=tmp_path)
    return f"git+{clone.as_uri()}@{commit}", run("git", "show", f"{commit}:trl_compat/__init__.py", cwd=ROOT)


def readme_line(tmp_path):
    """README's requirements line, as a user pastes it, with the repository's URL replaced by a
    clone of this repository: the release commit it names, and the version that commit holds."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository")
    import re

    readme = (ROOT / "README.md").read_text()
    match = re.search(r"^trl-compat @ (git\+<repository URL>@(?P<commit>[0-9a-f]{40}))  # release (?P<version>\S+)$", readme, re.M)
    assert match is not None, "README has no requirements line naming a release commit"
    # a shallow checkout may lack the release commit below its history (tests/test_release.py checks it
    # where the history is whole)
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT, capture_output=True, text=True)
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone: README's release commit may lie below its history")
    clone = tmp_path / "clone"
    run("git", "clone", "--quiet", "--no-checkout", ROOT, clone, cwd=tmp_path)
    url = match[1].replace("<repository URL>", clone.as_uri())
    init = run("git", "show", f"{match['commit']}:trl_compat/__init__.py", cwd=ROOT)
    assert f'__version__ = "{match["version"]}"' in init
    return url, match["version"], match["commit"]


@pytest.fixture(params=["wheel", "sdist", "vcs", "readme"])
def installed(request, tmp_path):
    """``(python, site-packages, version the source says)`` of a fresh venv with trl-compat installed
    from a requirements file, as a user pins it."""
    expected = VERSION
    if request.param == "wheel":
        url = one("trl_compat-*-py3-none-any.whl").as_uri()
    elif request.param == "sdist":
        url = one("trl_compat-*.tar.gz").as_uri()
    elif request.param == "readme":
        url, expected, request.node.release_commit = readme_line(tmp_path)
    else:
        url, init = vcs_url(tmp_path)
        # the commit's own version: the working tree may carry an uncommitted bump
        expected = next(line.split("=", 1)[1].strip().strip("\"'") for line in init.splitlines() if line.startswith("__version__"))
    requirements = tmp_path / "requirements.txt"
    requirements.write_text(f"trl-compat @ {url}\npackaging\n")
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    # pip of this env installs into the fresh one (--python): no pip bootstrapped per venv
    pip = [sys.executable, "-m", "pip", "--python", python, "--disable-pip-version-check"]
    run(*pip, "install", "--quiet", "--no-deps", "-r", requirements, cwd=tmp_path, timeout=600)
    run(*pip, "check", cwd=tmp_path)
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path).strip())
    return python, site, expected, pip


def site_file(name, request):
    """A start-up file as the installed source has it: the tree's, or the release commit's."""
    commit = getattr(request.node, "release_commit", None)
    path = f"{CHECK.SITE_FILES_DIR}/{name}"
    if commit is None:
        return (ROOT / path).read_bytes()
    return subprocess.run(["git", "show", f"{commit}:{path}"], cwd=ROOT, capture_output=True, check=True).stdout


def test_installed_version_script_report_and_start_up_files(installed, tmp_path, request):
    python, site, expected, pip = installed
    env = clean_env()
    out = run(
        python,
        "-c",
        "import importlib.metadata as m, trl_compat; print(m.version('trl-compat'), trl_compat.__version__, trl_compat.__file__)",
        cwd=tmp_path,
        env=env,
    ).split()
    assert out[:2] == [expected, expected]
    assert Path(out[2]).resolve().is_relative_to(site.resolve()), out[2]  # the installed copy, not the tree

    script = python.parent / ("trl-compat.exe" if os.name == "nt" else "trl-compat")
    assert run(script, "--version", cwd=tmp_path, env=env).strip() == f"trl-compat {expected}"
    report = json.loads(run(python, "-m", "trl_compat", "--json", cwd=tmp_path, env=env))
    assert report["versions"]["trl_compat"] == expected and report["patches"], report
    assert expected in run(python, "-m", "trl_compat", cwd=tmp_path, env=env)

    for name in CHECK.SITE_FILES:
        assert (site / name).read_bytes() == site_file(name, request), name
    loaded = "import sys; print('trl_compat' in sys.modules)"
    assert run(python, "-c", loaded, cwd=tmp_path, env=clean_env(TRL_COMPAT_AUTO="1")).strip() == "True"
    assert run(python, "-c", loaded, cwd=tmp_path, env=env).strip() == "False"

    run(*pip, "uninstall", "--quiet", "--yes", "trl-compat", cwd=tmp_path)
    left = [name for name in CHECK.SITE_FILES if (site / name).exists()] + list(site.glob("trl_compat*"))
    assert left == [], f"left behind by pip uninstall: {left}"
