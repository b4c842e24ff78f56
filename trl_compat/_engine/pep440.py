"""The part of PEP 440 the gate needs at start-up, without importing ``packaging``.

``packaging`` costs about as much as starting Python, and every process that imports
trl_compat gates every patch. This module answers only the cases where the answer is a
plain comparison of PEP 440 sort keys, the same cases ``packaging.specifiers`` itself
answers that way (its ``_fast_match``): ``>=``, ``<=``, ``==``, ``!=`` against a version
without a local label, and ``<``/``>`` against a final release or a version of another release
than the bound (PEP 440's carve-outs for ``<V``/``>V`` only ever exclude V's own pre-, dev and
post-releases). Everything else (those, local labels, wildcards, ``~=``, what does not parse)
returns ``None``, and the caller asks ``packaging``.
tests/engine/test_versions.py checks every answer against ``packaging``.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import re
    from collections.abc import Sequence

# PEP 440, appendix B (what packaging.version.VERSION_PATTERN is on Python < 3.11.5): for what is
# not in normal form. Compiled on first use: ``re`` is not loaded when Python starts.
_VERSION = r"""
    \s*v?
    (?:
        (?:(?P<epoch>[0-9]+)!)?
        (?P<release>[0-9]+(?:\.[0-9]+)*)
        (?P<pre>[-_\.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_\.]?(?P<pre_n>[0-9]+)?)?
        (?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_\.]?(?P<post_l>post|rev|r)[-_\.]?(?P<post_n2>[0-9]+)?))?
        (?P<dev>[-_\.]?(?P<dev_l>dev)[-_\.]?(?P<dev_n>[0-9]+)?)?
    )
    (?:\+(?P<local>[a-z0-9]+(?:[-_\.][a-z0-9]+)*))?
    \s*
"""
_compiled: list[re.Pattern[str]] = []  # the compiled pattern, once needed

_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "pre": 2, "preview": 2, "rc": 2}
_OPERATORS = (">=", "<=", "==", "!=", "<", ">")  # two-character ones first


class Parsed:
    """The parts of a version: ``pre`` is ``(rank: a=0, b=1, rc=2; number)``."""

    __slots__ = ("epoch", "release", "pre", "post", "dev", "local")

    def __init__(
        self,
        epoch: int,
        release: tuple[int, ...],
        pre: tuple[int, int] | None,
        post: int | None,
        dev: int | None,
        local: str | None,
    ) -> None:
        self.epoch, self.release, self.pre, self.post, self.dev, self.local = epoch, release, pre, post, dev, local

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Parsed) and all(getattr(self, f) == getattr(other, f) for f in self.__slots__)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return "Parsed(" + ", ".join(f"{f}={getattr(self, f)!r}" for f in self.__slots__) + ")"

    @property
    def base_version(self) -> str:
        return (f"{self.epoch}!" if self.epoch else "") + ".".join(map(str, self.release))

    def trimmed(self) -> tuple[int, tuple[int, ...]]:
        release = list(self.release)
        while release and release[-1] == 0:
            release.pop()
        return self.epoch, tuple(release)

    def key(self) -> tuple:
        """packaging's sort key, for versions without a local label."""
        if self.pre is None and self.post is None and self.dev is not None:
            pre = (-1, 0)  # X.devN sorts before X's pre-releases
        else:
            pre = self.pre if self.pre is not None else (3, 0)
        post = (0, 0) if self.post is None else (1, self.post)
        dev = (1, 0) if self.dev is None else (0, self.dev)
        return self.trimmed() + (pre + post + dev,)


def parse(text: str) -> Parsed | None:
    """The parts of a PEP 440 version, or None where it is not one."""
    if not isinstance(text, str):
        return None
    if text not in _parsed:
        _parsed[text] = _parse(text)
    return _parsed[text]


_parsed: dict[str, Parsed | None] = {}  # every patch's window names the same few versions


def _parse(text: str) -> Parsed | None:
    normal = _parse_normal(text)
    return normal if normal is not None else _parse_pattern(text)


def _parse_pattern(text: str) -> Parsed | None:
    if not _compiled:
        import re

        _compiled.append(re.compile(_VERSION, re.VERBOSE | re.IGNORECASE | re.ASCII))
    match = _compiled[0].fullmatch(text)
    if match is None:
        return None
    g = match.group
    pre = (_PRE_RANK[g("pre_l").lower()], int(g("pre_n") or 0)) if g("pre_l") else None
    post = g("post_n1") or g("post_n2") or ("0" if g("post_l") else None)
    return Parsed(
        epoch=int(g("epoch") or 0),
        release=tuple(int(part) for part in g("release").split(".")),
        pre=pre,
        post=None if post is None else int(post),
        dev=int(g("dev_n") or 0) if g("dev_l") else None,
        local=g("local"),
    )


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _parse_normal(text: str) -> Parsed | None:
    """A version in PEP 440's normal form, ``[N!]N(.N)*[{a|b|rc}N][.postN][.devN][+local]``, read
    without ``re`` (pip writes that form into METADATA; the windows are written in it); None
    for any other spelling, which the full pattern reads."""
    public, plus, local = text.partition("+")
    if plus and not all(part.isascii() and part.isalnum() and part == part.lower() for part in local.split(".")):
        return None
    epoch, has_epoch, public = public.rpartition("!")
    public, has_dev, dev = public.partition(".dev")
    public, has_post, post = public.partition(".post")
    *release, last = public.split(".")
    pre_rank, pre = None, ""
    for label, rank in (("rc", 2), ("a", 0), ("b", 1)):
        if label in last:
            last, _, pre = last.partition(label)
            pre_rank = rank
            break
    numbers = [_number(part) for part in release + [last] + ([epoch] if has_epoch else [])]
    suffixes = {
        name: _number(value)
        for name, value, present in (("pre", pre, pre_rank is not None), ("post", post, has_post), ("dev", dev, has_dev))
        if present
    }
    if None in numbers or None in suffixes.values():
        return None
    ints = [number for number in numbers if number is not None]
    given = {name: number for name, number in suffixes.items() if number is not None}
    return Parsed(
        ints.pop() if has_epoch else 0,
        tuple(ints),
        None if pre_rank is None else (pre_rank, given["pre"]),
        given.get("post"),
        given.get("dev"),
        local if plus else None,
    )


def _clauses(spec: str) -> Sequence[tuple[str, Parsed]] | None:
    clauses = []
    for part in spec.split(","):
        part = part.strip()
        op = next((op for op in _OPERATORS if part.startswith(op)), "")
        bound = part[len(op) :].strip()
        if not op or not bound[:1].isdigit() or any(c.isspace() or c in "*+" for c in bound):
            return None
        parsed = parse(bound)
        if parsed is None:
            return None
        clauses.append((op, parsed))
    return clauses


def contains(spec: str, version: Parsed) -> bool | None:
    """Whether ``version`` lies in the specifier set ``spec`` (pre-releases allowed), or None
    where only packaging can tell."""
    clauses = _clauses(spec)
    if clauses is None or version.local is not None:
        return None
    answer = True
    final = version.pre is None and version.dev is None and version.post is None
    for op, bound in clauses:
        if op in ("<", ">") and version.trimmed() == bound.trimmed() and not final:
            return None  # PEP 440's carve-outs for V's own pre-, post- and dev releases
        mine, theirs = version.key(), bound.key()
        answer = (
            answer
            and {
                ">=": mine >= theirs,
                "<=": mine <= theirs,
                "==": mine == theirs,
                "!=": mine != theirs,
                "<": mine < theirs,
                ">": mine > theirs,
            }[op]
        )
    return answer
