"""What a user pins and reads: the release README names, the version, the changelog, README's size.

The repository publishes branch ``main`` only, so git tags never reach users: README's
requirements line names the release **commit** (full hash) and the release's version. Here:

* that commit is in the repository's history and its ``trl_compat/__init__.py`` holds that version;
* CHANGELOG's newest dated section is ``__version__``, unless ``__version__`` is a ``.dev`` build
  (between releases main carries ``X.Y.Z.devN`` and an ``[Unreleased]`` section, above the release
  README names); at a release commit README still names the release before it (a commit cannot
  hold its own hash), the next commit names it;
* the release gate: at a release every by-hand row of matrix/RESULTS.md ran at or after the release
  before it (each row names the commit it ran at; that release's commit is the one titled
  ``Release X.Y.Z`` for CHANGELOG's dated section before ``__version__``'s); between releases each
  row names a commit of this branch's history;
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
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CHANGELOG = (ROOT / "CHANGELOG.md").read_text()
# trl-compat @ git+<repository URL>@<40 hex>  # release X.Y.Z
REQUIREMENT = re.compile(r"^trl-compat @ git\+(?P<url>[^@\n]+)@(?P<commit>[0-9a-f]{40})  # release (?P<version>\S+)$", re.M)
DATED = re.compile(r"^## \[(?P<version>[^\]]+)\] - (?P<date>\d{4}-\d{2}-\d{2})$", re.M)
README_LIMIT = 200
RESULTS = ROOT / "matrix" / "RESULTS.md"
# a row's commit: an abbreviated or full hash, "+" where the run had uncommitted changes on top of it
ROW_COMMIT = re.compile(r"(?P<commit>[0-9a-f]{7,40})\+?")
BY_HAND = "python -m tox -m by-hand -p 2 && python -m tox -e results"
# The gate holds from 0.7.0 on: 0.6.0 shipped the requests-optional crash fix with the by-hand rows of
# earlier rounds (its round could not run them all); every release after it waits for them.
GATE_FROM = "0.7.0"


def readme_release() -> re.Match:
    found = REQUIREMENT.findall(README)
    assert len(found) == 1, f"README must have one requirements line naming a release commit: {found}"
    match = REQUIREMENT.search(README)
    assert match is not None
    return match


def git(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)


def needs_history() -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs git and a git checkout of the repository (an sdist has no history)")
    if git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: the release commit may lie below its history")


def matrix_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "matrix" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def by_hand_commits(results: str) -> dict[str, str]:
    """{env: the commit its row names} from RESULTS.md's by-hand section, read as write_results.py
    carries it over ("-" for a row written before rows named their commit)."""
    writer = matrix_script("write_results")
    _, _, section = results.partition(writer.BY_HAND_HEADING)
    column = writer.BY_HAND_TABLE.index("commit")
    return {env: row[column] for env, row in writer.carried_rows(section).items()}


def release_commit(version: str, cwd: Path = ROOT) -> str | None:
    """The commit titled ``Release <version>`` in HEAD's history (CONTRIBUTING's release procedure)."""
    titles = (line.partition(" ") for line in git("log", "--format=%H %s", cwd=cwd).stdout.splitlines())
    found = [commit for commit, _, title in titles if title == f"Release {version}"]
    assert len(found) <= 1, f"{len(found)} commits are titled 'Release {version}'"
    return found[0] if found else None


def gate_failures(rows: dict[str, str], since: str | None, cwd: Path = ROOT) -> list[str]:
    """The by-hand rows that fail the release gate: a row without a commit, one whose commit is not in
    HEAD's history, and (``since``: the previous release's commit) one that ran before it."""
    failures = []
    for env, named in sorted(rows.items()):
        match = ROW_COMMIT.fullmatch(named)
        if match is None:
            failures.append(f"{env}: names no commit ({named!r})")
        elif git("merge-base", "--is-ancestor", match["commit"], "HEAD", cwd=cwd).returncode != 0:
            failures.append(f"{env}: {match['commit']} is not in this branch's history")
        elif since is not None and git("merge-base", "--is-ancestor", since, match["commit"], cwd=cwd).returncode != 0:
            failures.append(f"{env}: ran at {match['commit']}, before the previous release {since[:9]}")
    return failures


def test_readme_names_a_release_by_its_commit_not_a_tag():
    match = readme_release()
    assert match["url"] == "<repository URL>", match["url"]  # the one URL a user replaces
    assert pep440.parse(match["version"]) is not None and ".dev" not in match["version"], match["version"]
    assert "@v0." not in README and "@v1." not in README  # no tag: tags do not reach users


def test_readme_release_commit_holds_that_version():
    needs_history()
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


def test_every_by_hand_row_ran_since_the_previous_release():
    """The release gate (CONTRIBUTING, release procedure): the by-hand envs run before each release, so
    at a release (``__version__`` without .dev) each of their rows names a commit that contains the
    previous release's commit; between releases, a commit of this branch's history."""
    needs_history()
    rows = by_hand_commits(RESULTS.read_text())
    assert rows, "matrix/RESULTS.md has no by-hand rows"
    version = trl_compat.__version__
    since = None
    if ".dev" not in version and Version(version) >= Version(GATE_FROM):
        dated = [found[0] for found in DATED.findall(CHANGELOG)]
        assert len(dated) > 1 and dated[0] == version, f"CHANGELOG names no release before {version}: {dated[:2]}"
        since = release_commit(dated[1])
        assert since is not None, f"no commit titled 'Release {dated[1]}' in the history"
    failures = gate_failures(rows, since)
    assert not failures, f"{len(failures)} by-hand rows fail the release gate (run them: {BY_HAND}):\n" + "\n".join(failures)


def test_the_gate_reads_which_release_a_row_ran_after(tmp_path):
    needs_history()
    git("init", "-q", cwd=tmp_path)

    def commit(title: str) -> str:
        who = ("-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false")
        git(*who, "commit", "-q", "--allow-empty", "-m", title, cwd=tmp_path)
        return git("rev-parse", "HEAD", cwd=tmp_path).stdout.strip()

    before, release, after = commit("work"), commit("Release 0.1.0"), commit("more work")
    assert release_commit("0.1.0", cwd=tmp_path) == release
    assert release_commit("0.2.0", cwd=tmp_path) is None
    rows = {"a": before[:9], "b": release, "c": after[:9] + "+", "d": "-", "e": "0123456789"}
    assert gate_failures(rows, None, cwd=tmp_path) == ["d: names no commit ('-')", "e: 0123456789 is not in this branch's history"]
    failures = gate_failures(rows, release, cwd=tmp_path)
    assert [failure.split(":")[0] for failure in failures] == ["a", "d", "e"]
    assert f"ran at {before[:9]}, before the previous release {release[:9]}" in failures[0]


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
