"""Reading TRL's code for probes: one way, used by every probe.

``code(obj)`` unwraps ``obj`` (decorators, other patches' ``functools.wraps`` wrappers,
``staticmethod``/``classmethod``), reads its source and returns it as :class:`Code`: the
tokens without comments, docstrings or layout, joined by single spaces. So a probe is
not flipped by a comment that mentions a name, nor by a line break or a quote style:

    if "reset_prefix_cache" in code(module.GRPOTrainer):
        ...
    if "prompt_ids[:, -self.max_prompt_length :]" in code(method):   # spacing free

A needle is normalised the same way before the search. ``module_code("trl.scripts.vllm_serve")``
reads a module the same way without importing it (nor its packages): for a patch that must act
before TRL's module runs. When the source cannot be read
(a C function, a ``.pyc``-only install, a class built at run time), :class:`SourceUnavailable`
is raised with the reason; the engine reports the patch "undecided" with that reason.
"""

from __future__ import annotations

import ast
import functools
import importlib.machinery
import importlib.util
import inspect
import io
import sys
import textwrap
import tokenize
import weakref
from typing import Any

# defined by the engine, which catches it: it need not import this module (ast, inspect, tokenize) at start-up
from trl_compat._engine.patch import SourceUnavailable

_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING, tokenize.ENDMARKER}
# A string token right after one of these starts a statement: a docstring or a bare string.
_STATEMENT_START = {None, tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT}


class Code(str):
    """Normalised source text; ``needle in code`` normalises the needle first."""

    def __contains__(self, needle: object) -> bool:  # type: ignore[override]
        return isinstance(needle, str) and str.__contains__(self, normalise(needle))

    def count(self, needle: str, *bounds: Any) -> int:  # type: ignore[override]
        """How often ``needle``, normalised as ``in`` normalises it, occurs."""
        return str.count(self, normalise(needle), *bounds)


# Probes read the same TRL classes and needles again and again (GRPOTrainer's source, 10 times at one
# import): each is tokenised once per process (benchmarks/import_cost.md).
@functools.lru_cache(maxsize=512)
def normalise(source: str) -> str:
    """Tokens of ``source`` without comments, docstrings or layout, joined by one space.
    Single quotes become double quotes, so a probe does not depend on the quoting style.
    A fragment that does not close its brackets (a needle like ``"f(x,"``) keeps the
    tokens read before the end."""
    out = []
    depth, previous = 0, None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline):
            if tok.type == tokenize.COMMENT:
                continue
            if tok.type == tokenize.STRING and depth == 0 and previous in _STATEMENT_START:
                continue  # a docstring or bare string statement: prose, not code
            if tok.type == tokenize.OP:
                depth += tok.string in "([{"
                depth -= tok.string in ")]}"
            if tok.type not in _LAYOUT:
                out.append(tok.string.replace("'", '"') if tok.type == tokenize.STRING else tok.string)
            previous = tok.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return " ".join(out)


def unwrap(obj: Any) -> Any:
    """The function behind ``obj``: through static/classmethods, bound methods and
    ``__wrapped__`` chains (decorators, other patches' wrappers)."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    obj = getattr(obj, "__func__", obj)  # bound method
    try:
        return inspect.unwrap(obj)
    except ValueError:  # a __wrapped__ cycle
        return obj


def _source(obj: Any) -> str:
    target = unwrap(obj)
    try:
        return inspect.getsource(target)
    except (OSError, TypeError) as exc:
        name = getattr(target, "__qualname__", None) or getattr(target, "__name__", repr(target))
        raise SourceUnavailable(f"cannot read the source of {name} ({exc})") from None


# code(obj) by the object read (weakly: a class or function that goes away takes its entry along)
_CODE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def code(obj: Any) -> Code:
    """The normalised source of a module, class, function or method (see module doc); read once per
    object and process."""
    target = unwrap(obj)
    try:
        return _CODE[target]
    except (KeyError, TypeError):  # not read yet, or an object without weak references
        pass
    text = Code(normalise(_source(target)))
    try:
        _CODE[target] = text
    except TypeError:
        pass
    return text


def module_code(name: str) -> Code:
    """The normalised source of module ``name`` (see module doc), read from its file without
    importing it or its parent packages: the module being imported (or not imported at all) when a
    patch must act before its code runs. A module already in ``sys.modules`` is read from its file.
    ``ModuleNotFoundError`` when no such module exists (a release without it), ``SourceUnavailable``
    when it exists but its source cannot be read."""
    return Code(normalise(_module_source(name)))


def _module_source(name: str) -> str:
    loaded = sys.modules.get(name)
    origin = getattr(loaded, "__file__", None)
    if origin is None:
        spec = _spec_without_import(name)
        if spec is None:
            raise ModuleNotFoundError(f"no module named {name!r}", name=name)
        origin = getattr(spec, "origin", None)
    if not origin or not origin.endswith(".py"):
        raise SourceUnavailable(f"cannot find the source file of {name} ({origin or 'no spec'})")
    try:
        with tokenize.open(origin) as handle:  # the file's own encoding declaration
            return handle.read()
    except (OSError, SyntaxError) as exc:
        raise SourceUnavailable(f"cannot read the source of {name} ({exc})") from None


def _spec_without_import(name: str) -> Any:
    """``name``'s spec, walking the packages' ``__path__`` (loaded or found) instead of importing them."""
    parts = name.split(".")
    spec, path = None, None
    for depth in range(1, len(parts) + 1):
        prefix = ".".join(parts[:depth])
        package = sys.modules.get(prefix)
        if package is not None and depth < len(parts):
            path = getattr(package, "__path__", None)
            continue
        spec = importlib.machinery.PathFinder.find_spec(prefix, path)
        if spec is None and depth == 1:
            spec = importlib.util.find_spec(prefix)  # an editable install's own finder; a top-level name imports nothing
        if spec is None:
            return None
        path = spec.submodule_search_locations
    return spec


def module_syntax(name: str) -> ast.Module:
    """The parsed source of module ``name``, read as :func:`module_code` reads it (without importing
    it): for a probe that must know which statements run at the module's top level."""
    try:
        return ast.parse(_module_source(name))
    except SyntaxError as exc:
        raise SourceUnavailable(f"cannot parse the source of {name} ({exc})") from None


def syntax(obj: Any) -> ast.Module:
    """The parsed source of ``obj`` (unwrapped as by :func:`code`), for a probe that needs
    the structure of the code rather than its text (comments are not in the tree)."""
    try:
        return ast.parse(textwrap.dedent(_source(obj)))
    except SyntaxError as exc:
        raise SourceUnavailable(f"cannot parse the source of {getattr(obj, '__qualname__', obj)!r} ({exc})") from None


def defining_class(cls: type, name: str) -> type | None:
    """The first class along ``cls``'s MRO whose own ``__dict__`` holds ``name`` (None if none)."""
    for klass in inspect.getmro(cls):
        if name in vars(klass):
            return klass
    return None
