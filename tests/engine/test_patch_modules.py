"""What the patch modules and the off-policy guard say of the registry, read from their source
(nothing imported but the registry: stack-free).

- A patch's window and removal condition live in its registry entry: its module's docstring traces
  the bug and does not restate them in its own words ("Affected: ...", "Remove this patch when ...");
  it says when to delete the patch with the registry's ``remove_when`` word for word ("Delete when:"),
  which a test holds equal.
- The run-time policy: a patch that is not advice either keeps its own bookkeeping inside
  ``guarded(...)`` (the fallback helper) or says in its docstring that its errors must reach the
  user ("load-bearing: errors propagate").
- Every patch id the guard names (an alarm's ``fix=``, a likely cause's id) is a registry entry's.
"""

import ast
import importlib.util
import pathlib
import re

from trl_compat.patches import PATCHES

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
IDS = {patch.id for patch in PATCHES}
LOAD_BEARING = "load-bearing: errors propagate"
REPEATS = (re.compile(r"\bRemove this patch when\b"), re.compile(r"(?m)^\s*Affected:"))


def sources(impl):
    """The files of a patch's module: the module, or every file of its package."""
    spec = importlib.util.find_spec(impl)
    assert spec is not None and spec.origin, f"{impl} not found"
    if spec.submodule_search_locations:
        return sorted(p for d in spec.submodule_search_locations for p in pathlib.Path(d).rglob("*.py"))
    return [pathlib.Path(spec.origin)]


def docstring(impl):
    """The docstring of the module, or of the package's ``__init__``."""
    return ast.get_docstring(ast.parse(pathlib.Path(importlib.util.find_spec(impl).origin).read_text())) or ""


def uses_fallback(impl):
    return any(
        isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "guarded"
        for path in sources(impl)
        for node in ast.walk(ast.parse(path.read_text()))
    )


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_docstring_leaves_window_and_removal_to_the_registry(patch):
    doc = docstring(patch.impl)
    assert doc, f"{patch.impl} has no docstring tracing the bug"
    for repeat in REPEATS:
        assert not repeat.search(doc), f"{patch.impl}'s docstring repeats its registry entry ({repeat.pattern}): say it there only"


@pytest.mark.parametrize("patch", [p for p in PATCHES if p.kind != "advice"], ids=lambda p: p.id)
def test_every_patch_uses_the_fallback_or_says_its_errors_propagate(patch):
    fallback, says = uses_fallback(patch.impl), LOAD_BEARING in " ".join(docstring(patch.impl).split())
    assert fallback or says, (
        f"{patch.id}: wrap the patch's own bookkeeping in guarded(...), or say '{LOAD_BEARING}' in "
        f"{patch.impl}'s docstring (and why falling back would be the bug)"
    )


def named_patch_ids(tree):
    """The string constants ``tree`` gives as a patch id: a ``fix=`` keyword's, a value assigned
    to a name ``fix`` (also in tuple assignments), the last item a ``likely_cause*`` function returns."""
    found = set()

    def strings(node):
        return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}

    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "fix":
            found |= strings(node.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id == "fix":
                    found |= strings(node.value)
                elif isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                    for name, value in zip(target.elts, node.value.elts):
                        if isinstance(name, ast.Name) and name.id == "fix":
                            found |= strings(value)
        elif isinstance(node, ast.FunctionDef) and node.name.startswith("likely_cause"):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Tuple):
                    found |= strings(ret.value.elts[-1])
    return found


def test_the_collector_finds_each_form():
    code = """
def likely_cause(a):
    return "words", "id-from-return"
alarm(fix="id-from-keyword" if a else None)
cause, fix = "words", "id-from-tuple"
fix = "id-from-name"
"""
    assert named_patch_ids(ast.parse(code)) == {"id-from-return", "id-from-keyword", "id-from-tuple", "id-from-name"}


def test_every_patch_id_the_guard_names_is_a_registry_entry():
    named = {}
    for path in sorted((ROOT / "trl_compat" / "guard").rglob("*.py")):
        for pid in named_patch_ids(ast.parse(path.read_text())):
            named.setdefault(pid, []).append(str(path.relative_to(ROOT)))
    assert len(named) >= 5, f"the guard names fewer patch ids than it did ({sorted(named)}): is the collector still reading it?"
    unknown = {pid: files for pid, files in named.items() if pid not in IDS}
    assert not unknown, f"the guard names patch ids no registry entry has: {unknown}"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_the_docstring_says_when_to_delete_the_patch_as_the_registry_does(patch):
    # one fact, two places a reader looks: the registry's remove_when is the source, the docstring repeats it
    said = " ".join(docstring(patch.impl).split())
    assert f"Delete when: {patch.remove_when.rstrip('.')} (the registry's" in said, (
        f"{patch.impl}'s docstring must say 'Delete when: {patch.remove_when.rstrip('.')}' (its registry entry's remove_when)"
    )
