"""Append to the upstream ledger (``trl_compat/ledger/grpo.tsv``) the TRL changes it has no record of.

The ledger holds one record for every TRL commit since v0.14.0 that touches a file of GRPO's code
paths (``GRPO_PATHS``), and one for each behaviour changed between two published releases whose
history is not in the git directory (read from their wheels). This tool lists them and appends a
record with the verdict ``open`` for each one not yet there; a person then reads it and gives the
verdict (the stack-free test fails while any record is ``open``). Records already there are never
rewritten.

usage: python tools/update_ledger.py git GIT_DIR [--rev main]      commits of a TRL git directory
       python tools/update_ledger.py wheels OLD.whl NEW.whl         GRPO files that differ between two wheels
       python tools/update_ledger.py --header                          rewrite the header's counts
       add --dry-run to print the new records instead of appending them
"""

import argparse
import json
import os
import re
import subprocess
import sys
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from trl_compat.ledger import COLUMNS, LEDGER_PATH, header_lines, read_records  # noqa: E402

GRPO_PATHS = (
    "trl/trainer/grpo_trainer.py",
    "trl/trainer/grpo_config.py",
    "trl/trainer/utils.py",
    "trl/models/utils.py",
    "trl/extras/vllm_client.py",
    "trl/scripts/vllm_serve.py",
    "trl/generation/",
    "trl/data_utils.py",
    "trl/import_utils.py",
    "trl/_compat.py",
)
FIRST_TAG = "v0.14.0"
_TAG = re.compile(r"^v(\d+)\.(\d+)\.(\d+)$")  # final releases only: rc tags are not "a release that has it"
_PR = re.compile(r"\(#(\d+)\)\s*$")
_VERSION = re.compile(r"__version__\s*=\s*[\"']([^\"']+)[\"']")


def git(git_dir, *args):
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def release_tags(git_dir):
    """Final release tags from FIRST_TAG on, oldest first."""
    tags = []
    for tag in git(git_dir, "tag").split():
        found = _TAG.match(tag)
        if found:
            tags.append((tuple(int(x) for x in found.groups()), tag))
    first = tuple(int(x) for x in _TAG.match(FIRST_TAG).groups())
    return [tag for key, tag in sorted(tags) if key >= first]


def grpo_commits(git_dir, tags, rev):
    """(hash, subject) of every commit after FIRST_TAG that touches GRPO_PATHS, on ``rev`` and on the
    release branches (cherry-picks have hashes of their own), oldest first."""
    out = git(git_dir, "log", "--reverse", "--topo-order", "--format=%H%x09%s", rev, *tags, "^" + FIRST_TAG, "--", *GRPO_PATHS)
    return [tuple(line.split("\t", 1)) for line in out.splitlines() if line]


def first_releases(git_dir, tags, commits):
    """commit -> the earliest release that has it, or has its PR through a cherry-pick."""
    earliest = {}
    for tag in tags:
        for sha in git(git_dir, "rev-list", tag, "^" + FIRST_TAG, "--", *GRPO_PATHS).split():
            earliest.setdefault(sha, tag[1:])
    by_pr = {}
    for sha, subject in commits:
        found = _PR.search(subject)
        if found and sha in earliest:
            pr = found.group(1)
            if pr not in by_pr or _key(earliest[sha]) < _key(by_pr[pr]):
                by_pr[pr] = earliest[sha]
    result = {}
    for sha, subject in commits:
        found = _PR.search(subject)
        candidates = [v for v in (earliest.get(sha), by_pr.get(found.group(1)) if found else None) if v]
        result[sha] = min(candidates, key=_key) if candidates else ""
    return result


def _key(version):
    return tuple(int(x) for x in re.findall(r"\d+", version))


def dev_release(git_dir, rev):
    """The release a commit past the last tag goes into: the dev version of ``rev`` (1.10.0.dev0 -> 1.10.0)."""
    try:
        text = git(git_dir, "show", f"{rev}:VERSION")
    except subprocess.CalledProcessError:
        text = git(git_dir, "show", f"{rev}:trl/__init__.py")
        found = _VERSION.search(text)
        text = found.group(1) if found else ""
    return re.sub(r"\.dev\d*$", "", text.strip())


def commit_records(git_dir, rev):
    tags = release_tags(git_dir)
    commits = grpo_commits(git_dir, tags, rev)
    firsts = first_releases(git_dir, tags, commits)
    unreleased = dev_release(git_dir, rev)
    records = []
    for sha, subject in commits:
        found = _PR.search(subject)
        records.append(
            {
                "change": sha[:9],
                "pr": found.group(1) if found else "",
                "first_release": firsts[sha] or unreleased,
                "verdict": "open",
                "since": "",
                "when": "",
                "reason": "",
                "title": _clean(subject),
            }
        )
    return records


def wheel_version(path):
    return os.path.basename(path).split("-")[1]


def wheel_records(old, new):
    """One ``open`` record per GRPO file that differs between two wheels (a person splits it into
    one record per changed behaviour: ``OLD..NEW:file#2`` ...)."""
    pair = f"{wheel_version(old)}..{wheel_version(new)}"
    with zipfile.ZipFile(old) as a, zipfile.ZipFile(new) as b:
        names = sorted(n for n in set(a.namelist()) | set(b.namelist()) if n.startswith(GRPO_PATHS) and n.endswith(".py"))
        old_names, new_names = set(a.namelist()), set(b.namelist())
        changed = [n for n in names if n not in old_names or n not in new_names or a.read(n) != b.read(n)]
    return [
        {
            "change": f"{pair}:{name}",
            "pr": "",
            "first_release": wheel_version(new),
            "verdict": "open",
            "since": "",
            "when": "",
            "reason": "",
            "title": f"{name} changed between the {wheel_version(old)} and {wheel_version(new)} wheels",
        }
        for name in changed
    ]


def _clean(text):
    return " ".join(text.replace("\t", " ").split())


def known_changes(records):
    """What the ledger already has: commit hashes, and each wheel record's ``OLD..NEW:file`` (without ``#n``)."""
    return {r["change"].split("#", 1)[0] for r in records}


def append(records, path=LEDGER_PATH, dry_run=False):
    have = known_changes(read_records(path))
    new = [r for r in records if r["change"] not in have]
    lines = ["\t".join(r[c] for c in COLUMNS) + "\n" for r in new]
    if dry_run:
        sys.stdout.writelines(lines)
    else:
        with open(path, "a", encoding="utf-8") as out:
            out.writelines(lines)
    return new


def write(records, path=LEDGER_PATH):
    """The whole ledger, header (with its counts) first, then the records in the order given."""
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(line + "\n" for line in header_lines(records))
        out.write("\t".join(COLUMNS) + "\n")
        out.writelines("\t".join(r[c] for c in COLUMNS) + "\n" for r in records)


# The users'-installs rule: a module `from trl import GRPOTrainer` needs that TRL's requirements (no
# extras) do not bring is a record; the patch that answers it, where one does (else "open": triage it).
USERS_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "matrix", "user_installs", "results.json")
ANSWERED_BY = {"requests": "requests-optional", "urllib3": "requests-optional"}


def needed_modules(row):
    """The modules a users'-install row shows TRL's trainer import needs without its requirements
    bringing them: missing from the stack (the plain import's error, where trl_compat's import
    worked), or present by chance and needed once hidden (the row's ``needs``)."""
    found = set()
    plain, compat = row.get("plain") or {}, row.get("trl_compat") or {}
    site = plain.get("site") or {}
    # only an import at a TRL module's top level: one inside `if is_x_available():` that failed is
    # another class of bug (a wrong availability answer: transformers5-import)
    if site.get("top_level") and compat.get("import") == "ok":
        found.add(site["module"].partition(".")[0])
    if not row.get("needs_unchecked"):
        found |= {module for module, outcome in row.get("needs", {}).items() if outcome != "optional"}
    return found


def users_records(path=USERS_RESULTS):
    """One record per needed module: the releases whose rows show it, and the patch that answers it."""
    with open(path, encoding="utf-8") as handle:
        rows = json.load(handle)
    releases = {}
    for row in rows:
        for module in needed_modules(row):
            releases.setdefault(module, set()).add(row["trl"])
    checked = sorted({row["trl"] for row in rows if row.get("trl_compat", {}).get("import") == "ok"}, key=_key)
    records = []
    for module, seen in sorted(releases.items()):
        first, last = min(seen, key=_key), max(seen, key=_key)
        # the first release after the window whose rows show it gone (the window's end so far, if none ran)
        after = [release for release in checked if _key(release) > _key(last) and release not in seen]
        patch = ANSWERED_BY.get(module)
        records.append(
            {
                "change": f"{first}..{last}:imports:{module}",
                "pr": "",
                "first_release": after[0] if after else last,
                "verdict": f"patched:{patch}" if patch else "open",
                "since": first,
                "when": "",
                "reason": f"`from trl import GRPOTrainer` needs {module}, which TRL's requirements (no extras) do not bring "
                f"(matrix/USER_INSTALLS.md: {len(seen)} release(s) from {first} to {last})",
                "title": f"users' installs: {module} imported unconditionally",
            }
        )
    return records


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="print the new records, append nothing")
    parser.add_argument("--ledger", default=LEDGER_PATH, help=argparse.SUPPRESS)
    parser.add_argument("--header", action="store_true", help="rewrite the header's counts, append nothing")
    sources = parser.add_subparsers(dest="source")
    from_git = sources.add_parser("git", help="the commits of a TRL git directory")
    from_git.add_argument("git_dir")
    from_git.add_argument("--rev", default="main")
    from_wheels = sources.add_parser("wheels", help="the GRPO files that differ between two TRL wheels")
    from_wheels.add_argument("old")
    from_wheels.add_argument("new")
    from_users = sources.add_parser("users", help="the modules matrix/USER_INSTALLS.md shows the trainer's import needs")
    from_users.add_argument("--results", default=USERS_RESULTS)
    args = parser.parse_args(argv)
    if args.header:
        write(read_records(args.ledger), args.ledger)
        return 0
    if args.source is None:
        parser.error("name a source (git, wheels or users), or --header")
    if args.source == "users":
        records = users_records(args.results)
    else:
        records = commit_records(args.git_dir, args.rev) if args.source == "git" else wheel_records(args.old, args.new)
    new = append(records, args.ledger, args.dry_run)
    print(f"{len(new)} new record(s) of {len(records)} listed", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
