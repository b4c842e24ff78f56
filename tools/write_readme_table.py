"""Write README.md's patch table from the registry (``trl_compat.patches.PATCHES``).

The table sits between the marker comments ``<!-- patch-table:start -->`` and
``<!-- patch-table:end -->``; everything else in README is left as it is. One row per patch, in
registry order: its id, what a user sees without it (``symptom``; ``summary`` while an entry has
no symptom yet), the versions it is checked on (``requires``, rendered for people), and where it
was fixed upstream (``fixed_in``, with a link to ``upstream``'s first issue or PR; an entry that
declares no ``fixed_in`` shows ``upstream``'s first clause). Needs no TRL: the registry is plain data.

usage: python tools/write_readme_table.py            rewrite the table in README.md
       python tools/write_readme_table.py --check    exit 1 if README.md's table is stale
"""

import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
START = "<!-- patch-table:start -->"
END = "<!-- patch-table:end -->"
REGENERATE = "python tools/write_readme_table.py"

# How each distribution a window names is spelled for people.
DISPLAY_NAMES = {"trl": "TRL", "vllm": "vLLM", "deepspeed": "DeepSpeed"}

_CLAUSE = re.compile(r"^\s*(>=|<=|==|<|>)\s*([0-9][0-9A-Za-z.+!-]*)\s*$")
_RELEASE = re.compile(r"^(\d+(?:\.\d+)*)")
_URL = re.compile(r"https://github\.com/([^/\s]+)/([^/\s]+)/(pull|issues)/(\d+)")


def _release(version):
    """The release numbers of a PEP 440 version, without pre/dev/local parts: ``"0.16.0a0"`` -> (0, 16, 0)."""
    match = _RELEASE.match(version)
    if match is None:
        return None
    numbers = [int(part) for part in match.group(1).split(".")]
    return tuple(numbers + [0] * (3 - len(numbers)))


def _at_least(release):
    """``(5, 0, 0)`` -> ``"5.0"``; ``(0, 14, 1)`` -> ``"0.14.1"``."""
    if release[2] == 0:
        return f"{release[0]}.{release[1]}"
    return ".".join(map(str, release))


def _last_before(release):
    """The last release before ``release``, as people write it: before 0.16.0 is ``0.15.x``, before
    0.18.2 is ``0.18.1``; None where that is not a release of the same major (before 1.0.0)."""
    major, minor, micro = release
    if micro:
        return f"{major}.{minor}.{micro - 1}"
    if minor:
        return f"{major}.{minor - 1}.x"
    return None


def render_window(dist, spec):
    """One distribution's window, e.g. ``TRL 0.14.0 – 0.15.x``, ``transformers ≥ 5.0``,
    ``DeepSpeed installed``. The main-branch dev builds at both ends (``affected()``'s ``.dev0``
    and ``a0``) are not shown. A specifier this does not know is shown as it is written."""
    name = DISPLAY_NAMES.get(dist, dist)
    lower = upper = None
    for clause in spec.split(","):
        match = _CLAUSE.match(clause)
        release = match and _release(match.group(2))
        if not match or release is None or match.group(1) not in (">=", "<"):
            return f"{name} {spec}"
        if match.group(1) == ">=":
            lower = release
        else:
            upper = release
    if upper is None:
        if lower is None or lower == (0, 0, 0):
            return f"{name} installed"
        return f"{name} ≥ {_at_least(lower)}"
    last = _last_before(upper)
    if last is None:
        return (
            f"{name} < {'.'.join(map(str, upper))}"
            if lower in (None, (0, 0, 0))
            else (f"{name} {'.'.join(map(str, lower))} – before {'.'.join(map(str, upper))}")
        )
    if lower is None or lower == (0, 0, 0):
        return f"{name} ≤ {last}"
    first = ".".join(map(str, lower))
    if last == first or (last.endswith(".x") and lower[2] == 0 and last == f"{lower[0]}.{lower[1]}.x"):
        return f"{name} {last}"
    return f"{name} {first} – {last}"


def render_requires(requires):
    """Every window of a patch, TRL's first: ``TRL 0.14.0 – 0.19.x; transformers ≥ 5.0``."""
    order = sorted(requires, key=lambda dist: dist != "trl")
    return "; ".join(render_window(dist, requires[dist]) for dist in order)


def _link(match):
    owner, repo, kind, number = match.groups()
    label = "TRL" if (owner, repo) == ("huggingface", "trl") else repo
    return f"[{label} {'PR' if kind == 'pull' else 'issue'} #{number}]({match.group(0)})"


def render_upstream(upstream, fixed_in=None, requires=None):
    """Short: the releases that fixed it (``fixed_in``) and a link to the first issue or PR of
    ``upstream``, e.g. ``TRL 0.17.0 ([TRL issue #3287](...))``; for ``{}``, ``not fixed upstream (...)``
    where TRL's window in ``requires`` is open (the bug is in the newest release: no release has
    fixed it yet), ``not fixed (...)`` where it is closed (later releases dropped the code);
    where ``fixed_in`` is not declared (None), the first clause of ``upstream``."""
    if fixed_in is None:
        return _URL.sub(_link, _first_clause(upstream))
    first_url = _URL.search(upstream)
    link = f" ({_link(first_url)})" if first_url else ""
    releases = "; ".join(f"{DISPLAY_NAMES.get(dist, dist)} {version}" for dist, version in fixed_in.items())
    if not releases:
        open_window = requires is not None and "<" not in requires.get("trl", "<")
        releases = "not fixed upstream" if open_window else "not fixed"
    return releases + link


def _first_clause(text):
    """The text up to its first ``;`` outside parentheses, without the parenthesised asides."""
    kept, depth = [], 0
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth = max(depth - 1, 0)
        elif depth == 0:
            if char == ";":
                break
            kept.append(char)
    return " ".join("".join(kept).split())


def _cell(text):
    return " ".join(text.split()).replace("|", "\\|")


def table(patches):
    """The Markdown table, one row per patch, in registry order."""
    lines = ["| patch id | what you see without it | affected | fixed upstream |", "|---|---|---|---|"]
    for patch in patches:
        seen = patch.symptom or patch.summary
        lines.append(
            f"| `{patch.id}` | {_cell(seen)} | {_cell(render_requires(patch.requires))} "
            f"| {_cell(render_upstream(patch.upstream, patch.fixed_in, patch.requires))} |"
        )
    return "\n".join(lines) + "\n"


def block(patches):
    """What stands between the markers, markers included."""
    return f"{START}\n{table(patches)}{END}"


def current_block(text):
    """README's block between the markers (markers included); ValueError without them."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"README.md has no {START} ... {END} markers")
    return text[start : end + len(END)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if README's table differs from the registry's")
    parser.add_argument("--readme", default=README, help="the README to check or rewrite (default: the repository's)")
    args = parser.parse_args(argv)
    from trl_compat.patches import PATCHES

    with open(args.readme, encoding="utf-8") as handle:
        text = handle.read()
    try:
        old = current_block(text)
    except ValueError as err:
        print(f"{args.readme}: {err}", file=sys.stderr)
        return 2
    new = block(PATCHES)
    if args.check:
        if old != new:
            print(f"{args.readme}: the patch table is stale (the registry changed); regenerate it with: {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    if old != new:
        with open(args.readme, "w", encoding="utf-8") as handle:
            handle.write(text.replace(old, new, 1))
        print(f"{args.readme}: patch table rewritten ({len(PATCHES)} patches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
