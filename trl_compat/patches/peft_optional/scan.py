"""Which functions of the trainer module use a PEFT name the module does not define: their
bytecode's global loads, through decorators and nested code. peft is never imported."""

from __future__ import annotations

import builtins
import dis
import types
from collections.abc import Iterator

PEFT_NAMES = ("PeftModel", "PeftConfig", "get_peft_model")
GUARD = "is_peft_available"


def _members(obj) -> Iterator[types.FunctionType]:
    """The plain functions behind a namespace entry, through decorators."""
    if isinstance(obj, (staticmethod, classmethod)):
        obj = obj.__func__
    if isinstance(obj, property):
        for accessor in (obj.fget, obj.fset, obj.fdel):
            if accessor is not None:
                yield from _members(accessor)
        return
    seen = 0
    while obj is not None and seen < 20:  # a __wrapped__ chain, each level may be ours
        if isinstance(obj, types.FunctionType):
            yield obj
        obj = getattr(obj, "__wrapped__", None) if callable(obj) else None
        seen += 1


def _functions(module: types.ModuleType) -> Iterator[tuple[str, types.FunctionType]]:
    """Every function that looks its globals up in ``module``'s namespace."""
    namespace = vars(module)
    seen = set()
    for name, obj in list(namespace.items()):
        if isinstance(obj, type) and getattr(obj, "__module__", None) == module.__name__:
            entries = [(f"{name}.{attr}", member) for attr, member in list(vars(obj).items())]
        else:
            entries = [(name, obj)]
        for qualname, entry in entries:
            for fn in _members(entry):
                if fn.__globals__ is namespace and id(fn) not in seen:
                    seen.add(id(fn))
                    yield qualname, fn


def _global_loads(code: types.CodeType) -> Iterator[str]:
    try:
        for instruction in dis.get_instructions(code):
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(instruction.argval, str):
                yield instruction.argval
    except Exception:  # noqa: BLE001 - unknown bytecode: co_names is a superset
        yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):  # nested functions, comprehensions
            yield from _global_loads(const)


def scan(module: types.ModuleType) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """``(unguarded, guarded)``: PEFT name -> functions of ``module`` that load
    it as a global although the module does not define it."""
    namespace = vars(module)
    unguarded: dict[str, list[str]] = {}
    guarded: dict[str, list[str]] = {}
    for qualname, fn in _functions(module):
        loads = set(_global_loads(fn.__code__))
        missing = [n for n in PEFT_NAMES if n in loads and n not in namespace and not hasattr(builtins, n)]
        for name in missing:
            (guarded if GUARD in loads else unguarded).setdefault(name, []).append(qualname)
    return unguarded, guarded


def where(refs: dict[str, list[str]]) -> str:
    return "; ".join(f"{name} in {', '.join(sorted(fns))}" for name, fns in refs.items())
