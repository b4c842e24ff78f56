"""requests-optional: without ``requests`` installed, ``from trl import GRPOTrainer`` fails
with ``ModuleNotFoundError: No module named 'requests'``, vLLM or not.

The bug
    TRL PR #4845 (commit c6e3d2696, released in 0.28.0: "Add retry strategy to vLLM Client") put
    ``from requests.adapters import HTTPAdapter`` and ``from urllib3.util.retry import Retry`` at the
    top of ``trl/generation/vllm_client.py``, outside the module's own ``if is_requests_available():``
    block. The GRPO trainer imports that module on every path (``trl/generation/vllm_generation.py``
    imports ``VLLMClient``; 0.28 - 0.29's trainer imports it itself), so the trainer's import needs
    ``requests`` and ``urllib3``, which TRL declares only in its ``vllm`` extra. Nothing else a user
    installs pulled them in for long: transformers 4 required ``requests``, transformers 5 and
    huggingface_hub 1.x do not, and datasets dropped it in 5.1.0. So ``pip install trl==X peft`` for
    any X from 0.29.0 to 1.14.1, resolved today, gives a stack where the trainer cannot be imported
    (0.28.x too, where it resolves transformers 5). TRL 1.14.2 moved both imports inside the
    ``if is_requests_available():`` block (the 1.14.1..1.14.2 diff of ``vllm_client.py``); the
    client's ``__init__`` already raised ``ImportError("requests is not installed...")`` first thing
    in every release of the window, so server mode without ``requests`` says what is missing.

How the probe recognises it
    It parses the module's source without importing it (``_helpers.source.module_syntax``) and
    looks for ``import`` statements of ``requests`` or ``urllib3`` at the module's top level (1.14.2
    has them only inside the ``if``: "not needed"). With such a statement, "needed" where a package
    it imports is not installed (``importlib.util.find_spec`` of the top-level name, which imports
    nothing). With both installed the import works: "not needed", said before any source is read
    (most installs: the probe costs two lookups). "Undecided" when the
    source cannot be read (a ``.pyc``-only install).

The fix
    A finder just before the path finder in ``sys.meta_path`` answers for ``trl.generation.vllm_client`` only: it
    takes the spec the path finder gives and swaps its loader for one that compiles the module from
    its source with each top-level import of a missing package wrapped in ``try`` / ``except
    ImportError: pass`` (the tree is changed, not the text: every other line keeps its number, so
    tracebacks still point at TRL's file). The module then lacks those names, as 1.14.2's does
    without ``requests``; once it is imported, the names (``HTTPAdapter``, ``Retry``) are set through
    the Patcher to placeholders that raise ``ImportError`` naming the package when called (TRL's own
    check in ``VLLMClient.__init__`` raises before them, as 1.14.2 does). Nothing else is rewritten;
    ``requests`` stays absent for every other importer (``import requests`` still fails). Revert
    deletes the placeholders and removes the finder: an imported module is left as 1.14.2 leaves it.

Run time: the rewrite and the placeholders run inside ``guarded(...)``: if the rewrite fails, the
finder steps aside and Python imports TRL's module as it is (the import fails as it would without
trl_compat; under TRL_COMPAT_STRICT=1 the error propagates).

Delete when: trl_compat no longer supports TRL 0.28.0 - 1.14.1 (the registry's ``remove_when``; a
test holds the two equal).
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import sys

from trl_compat._engine import guarded, hooks, needed, not_needed
from trl_compat._helpers.source import module_syntax

PATCH_ID = "requests-optional"
TARGET = "trl.generation.vllm_client"
# The packages TRL declares only in its `vllm` extra that the module imports at its top level.
OPTIONAL_PACKAGES = ("requests", "urllib3")


def _root(statement: ast.stmt) -> str | None:
    """The top-level package an ``import`` statement imports (None for relative or other statements)."""
    if isinstance(statement, ast.ImportFrom) and statement.level == 0 and statement.module:
        return statement.module.partition(".")[0]
    if isinstance(statement, ast.Import):
        return statement.names[0].name.partition(".")[0]
    return None


def top_level_imports(tree: ast.Module) -> list[ast.stmt]:
    """The statements at the module's top level that import one of :data:`OPTIONAL_PACKAGES`."""
    return [statement for statement in tree.body if _root(statement) in OPTIONAL_PACKAGES]


def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def missing_packages(statements: list[ast.stmt]) -> list[str]:
    """The packages those statements import that are not installed, in order, once each."""
    roots = dict.fromkeys(_root(statement) for statement in statements)
    return [root for root in roots if root is not None and not installed(root)]


def probe(module):
    if all(installed(package) for package in OPTIONAL_PACKAGES):  # most installs: no source to parse
        return not_needed(f"{' and '.join(OPTIONAL_PACKAGES)} are installed: {TARGET} imports whatever it imports of them")
    try:
        tree = module_syntax(TARGET)
    except ModuleNotFoundError:
        return not_needed(f"this release has no {TARGET}")
    statements = top_level_imports(tree)
    if not statements:
        return not_needed(f"{TARGET} imports requests and urllib3 only where they are installed")
    shown = "; ".join(ast.unparse(statement) for statement in statements)
    missing = missing_packages(statements)
    absent = f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed"
    return needed(f"{TARGET} runs `{shown}` at import, and {absent}: the GRPO trainer cannot be imported")


def placeholder(package: str, name: str):
    """What ``from <package>... import <name>`` leaves when ``package`` is missing: a callable that
    says so when used."""

    def missing(*args, **kwargs):
        hint = f"trl_compat {PATCH_ID}: {name} needs it"
        raise ImportError(f"{package} is not installed. Please install it with `pip install {package}` ({hint})")

    missing.__qualname__ = missing.__name__ = name
    return missing


def bound_names(statement: ast.stmt) -> list[str]:
    """The names an ``import`` statement binds."""
    return [alias.asname or alias.name.partition(".")[0] for alias in statement.names]  # type: ignore[attr-defined]


def guard_imports(tree: ast.Module, missing: list[str]) -> ast.Module:
    """``tree`` with each top-level import of a package in ``missing`` inside ``try`` / ``except
    ImportError: pass``; every new node takes the line of the statement it wraps."""
    body = []
    for statement in tree.body:
        if _root(statement) not in missing:
            body.append(statement)
            continue
        error, skip = ast.Name("ImportError", ast.Load()), ast.Pass()
        handler = ast.ExceptHandler(type=error, name=None, body=[skip])
        wrapped = ast.Try(body=[statement], handlers=[handler], orelse=[], finalbody=[])
        for node in (wrapped, handler, error, skip):
            ast.copy_location(node, statement)
        body.append(wrapped)
    tree.body = body
    return ast.fix_missing_locations(tree)


class GuardingLoader(importlib.machinery.SourceFileLoader):
    """Compiles the module from its source with the missing packages' imports guarded; never reads
    or writes bytecode (the cached bytecode is TRL's unchanged module)."""

    def get_code(self, fullname):
        source = importlib.util.decode_source(self.get_data(self.path))
        tree = ast.parse(source, self.path)
        missing = missing_packages(top_level_imports(tree))
        return compile(guard_imports(tree, missing), self.path, "exec", dont_inherit=True)


class Finder:
    """A meta-path finder for :data:`TARGET` alone: the path finder's spec with :class:`GuardingLoader`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != TARGET:
            return None
        spec = None
        with guarded(PATCH_ID, f"preparing the import of {TARGET}", fallback=f"{TARGET} is imported unchanged"):
            found = importlib.machinery.PathFinder.find_spec(fullname, path)
            if found is not None and isinstance(found.loader, importlib.machinery.SourceFileLoader):
                found.loader = GuardingLoader(fullname, found.origin)
                spec = found
        return spec

    def __repr__(self):
        return f"<trl_compat {PATCH_ID} finder for {TARGET}>"


def missing_names() -> dict[str, str]:
    """``name -> package`` for each name the module's top-level imports of missing packages bind."""
    statements = top_level_imports(module_syntax(TARGET))
    missing = missing_packages(statements)
    return {name: _root(s) for s in statements if _root(s) in missing for name in bound_names(s)}  # type: ignore[misc]


def apply(module, patcher):
    names = missing_names()
    finder = Finder()
    cancelled = []

    def remove():
        cancelled.append(True)  # the hook below does nothing once the patch is reverted
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)

    # just before the path finder, whose answer it changes: behind the finders that watch imports (the
    # engine's post-import hooks among them, which then see this module's import like any other)
    position = next((i for i, f in enumerate(sys.meta_path) if f is importlib.machinery.PathFinder), len(sys.meta_path))
    sys.meta_path.insert(position, finder)
    patcher.on_undo(remove)

    def bind_placeholders(client_module):
        if cancelled:
            return
        with guarded(PATCH_ID, f"binding placeholders in {TARGET}"):
            for name, package in names.items():
                if not hasattr(client_module, name):
                    patcher.replace(client_module, name, placeholder(package, name))

    hooks.when_imported(TARGET, bind_placeholders)
