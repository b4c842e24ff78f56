"""What a user pins and reads: the release README names, the version, the changelog, README's size.

The repository publishes branch ``main`` only, so git tags never reach users: README's
requirements line names the release **commit** (full hash) and the release's version. Here:

* that commit is in the repository's history and its ``trl_compat/__init__.py`` holds that version;
* CHANGELOG's newest dated section is ``__version__``, unless ``__version__`` is a ``.dev`` build
  (between releases main carries ``X.Y.Z.devN`` and an ``[Unreleased]`` section, above the release
  README names); at a release commit README still names the release before it (a commit cannot
  hold its own hash), the next commit names it;
* ``trl-compat --version`` prints ``__version__``;
* README stays at most 200 lines outside its generated patch table;
* the switches' accepted values are the same everywhere they are read.

``tox -e package`` installs from README's line itself (tests/package/test_install.py)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import trl_compat
from trl_compat._engine import pep440, settings

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
# trl-compat @ git+<repository URL>@<40 hex>  # release X.Y.Z
REQUIREMENT = re.compile(r"^trl-compat @ git\+(?P<url>[^@\n]+)@(?P<commit>[0-9a-f]{40})  # release (?P<version>\S+)$", re.M)
DATED = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.M)
README_LIMIT = 200


def readme_release() -> re.Match:
    found = REQUIREMENT.findall(README)
    assert len(found) == 1, f"README must have one requirements line naming a release commit: {found}"
    match = REQUIREMENT.search(README)
    assert match is not None
    return match


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_readme_names_a_release_by_its_commit_not_a_tag():
    match = readme_release()
    assert match["url"] == "<repository URL>", match["url"]  # the one URL a user replaces
    assert pep440.parse(match["version"]) is not None and ".dev" not in match["version"], match["version"]
    assert "@v0." not in README and "@v1." not in README  # no tag: tags do not reach users


def test_readme_release_commit_holds_that_version():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository (an sdist has no history)")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the release commit may lie below its history")
    match = readme_release()
    kind = git("cat-file", "-t", match["commit"])
    assert kind.returncode == 0 and kind.stdout.strip() == "commit", f"README's release commit {match['commit']} is not in the history"
    assert git("merge-base", "--is-ancestor", match["commit"], "HEAD").returncode == 0, "README's release commit is not on this branch"
    init = git("show", f"{match['commit']}:trl_compat/__init__.py").stdout
    assert f'__version__ = "{match["version"]}"' in init, f"{match['commit']} is not release {match['version']}"


def test_changelog_newest_dated_section_is_the_version_unless_dev():
    dated = DATED.findall(CHANGELOG)
    assert dated, "CHANGELOG has no dated release section"
    newest = dated[0][0]
    version = trl_compat.__version__
    parsed = pep440.parse(version)
    assert parsed is not None, version
    if ".dev" in version:
        # between releases: an [Unreleased] section above the newest release, which precedes this build
        assert CHANGELOG.index("## [Unreleased]") < CHANGELOG.index(f"## [{newest}]")
        assert pep440.parse(newest).key() < parsed.key(), (newest, version)
        assert readme_release()["version"] == newest, "README must name the newest release"
    else:
        assert newest == version, f"CHANGELOG's newest release is {newest}, __version__ is {version}"
        # the release commit itself cannot name its own hash: there README still names the release before
        # it, and the commit after it names this one
        named = readme_release()["version"]
        assert named == version or (len(dated) > 1 and named == dated[1][0]), (named, version)


def test_the_cli_prints_the_version():
    out = subprocess.run([sys.executable, "-m", "trl_compat", "--version"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"trl-compat {trl_compat.__version__}"


def test_readme_is_short_outside_its_generated_table():
    start, end = README.index("<!-- patch-table:start -->"), README.index("<!-- patch-table:end -->")
    outside = len(README[:start].splitlines()) + len(README[end:].splitlines())
    assert outside <= README_LIMIT, f"README has {outside} lines outside the generated table (limit {README_LIMIT})"


def test_readme_and_docs_link_files_that_exist():
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links {target}, which is not there"


def test_guard_doc_lists_every_metric_the_guard_logs():
    names = set()
    for path in (ROOT / "trl_compat" / "guard").rglob("*.py"):
        names |= set(re.findall(r"\.add\(\s*\"([a-z0-9_]+)\"", path.read_text()))
    names.add("alarms_total")  # the callback's own count
    doc = (ROOT / "docs" / "guard.md").read_text()
    listed = set(re.findall(r"`offpolicy/([a-z0-9_]+)`", doc))
    assert names and names <= listed, f"docs/guard.md lacks {sorted(names - listed)}"


def test_keep_envs_reads_like_every_other_switch():
    spec = importlib.util.spec_from_file_location("discard_env", ROOT / "matrix" / "discard_env.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (module.ON, module.OFF) == (settings.ON, settings.OFF)
    for value in settings.ON + ("TRUE", " yes "):
        assert module.keep_envs(value) is True, value
    for value in settings.OFF + ("False", " OFF "):
        assert module.keep_envs(value) is False, value


def test_contributing_names_the_tox_the_project_needs():
    tox_ini = (ROOT / "tox.ini").read_text()
    needed = re.search(r"requires = tox>=([\d.]+)", tox_ini)
    assert needed is not None
    text = (ROOT / "CONTRIBUTING.md").read_text()
    assert f"tox {needed[1]} or newer" in text or f"tox>={needed[1]}" in text
    assert "(4.11 or newer)" not in text
