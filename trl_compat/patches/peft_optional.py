"""peft-optional: GRPO without peft installed must not die on PEFT names.

Remove this patch when trl_compat no longer supports TRL < 0.16.0 (including
0.15.0.dev0/0.16.0.dev0 git installs from before PR #2848).

The bug
    ``trl/trainer/grpo_trainer.py`` binds ``PeftConfig``, ``get_peft_model``
    (and for a while ``PeftModel``) only ``if is_peft_available()``, yet its
    functions use those names unconditionally:

    * TRL PR #2725 (commit 81221661c, 2025-02-12) added
      ``elif isinstance(unwrapped_model, PeftModel)`` to
      ``GRPOTrainer._move_model_to_vllm``. Full fine-tuning with
      ``use_vllm=True`` on a machine without peft then dies with
      ``NameError: name 'PeftModel' is not defined`` (issue #2849; fixed by
      PR #2850 b0f513c13 with an ``is_peft_available() and`` guard, and by
      PR #2818 with accelerate's ``is_peft_model``). No PyPI release carries
      that line; every git install of main from that window does, and reports
      version 0.15.0.dev0.
    * In every release 0.14.0 to 0.15.2 (and main up to PR #2848, 9b3c5bf64,
      version 0.16.0.dev0), ``GRPOTrainer(..., peft_config=...)`` without
      peft fails with ``NameError: name 'get_peft_model' is not defined``,
      after the model has been loaded, instead of saying what to install.
      From PR #2848 on (0.16.0) TRL raises an ImportError itself.

Affected: trl >=0.14.0.dev0,<=0.16.0.dev0 when peft is not importable.

How the probe recognises it
    It walks the bytecode of every function whose globals are the trainer
    module's namespace (module functions, methods of classes defined there,
    through decorators' ``__wrapped__`` and into nested code objects), and
    collects global loads of ``PeftModel``, ``PeftConfig`` or
    ``get_peft_model`` that the module does not define. A function that also
    calls ``is_peft_available`` counts as guarded (that is TRL's own fix).
    Unguarded references plus ``importlib.util.find_spec("peft") is None``
    means the bug is there. peft is never imported.

The fix
    Binds stand-ins for exactly the missing names in the module namespace:
    ``PeftModel``/``PeftConfig`` become classes nobody is an instance of (so
    "is this a PeftModel?" is simply no), and ``get_peft_model`` raises an
    ImportError that names the fix. ``GRPOTrainer.__init__`` is wrapped to
    raise that ImportError when ``peft_config`` is given, before TRL loads the
    model or does any other work. With peft installed nothing is changed.

"""

from __future__ import annotations

import builtins
import dis
import functools
import importlib.util
import inspect
import sys
import types
from typing import Dict, Iterator, List, Tuple

from trl_compat._engine import Patch, affected, needed, not_needed, undecided

PEFT_NAMES = ("PeftModel", "PeftConfig", "get_peft_model")
GUARD = "is_peft_available"
# A release of your stack's day: the newest peft may want a newer transformers or torch.
INSTALL_HINT = "`pip install peft` (a release of your transformers' day, e.g. peft 0.14 or 0.15 for TRL 0.14-0.16)"


def _message(what: str) -> str:
    return (
        f"{what} needs PEFT, which is not installed. Install it with {INSTALL_HINT} and restart Python. "
        "Without peft_config, GRPO trains the full model and needs no PEFT. "
        "(Raised by trl_compat's peft-optional patch; TRL itself would fail with a NameError.)"
    )


def _peft_importable() -> bool:
    """Whether ``import peft`` could succeed, without importing it."""
    if "peft" in sys.modules:
        return sys.modules["peft"] is not None  # None blocks the import
    try:
        return importlib.util.find_spec("peft") is not None
    except (ImportError, ValueError):
        return False


# -- stand-ins bound into the trainer module -------------------------------------


class _Unavailable(type):
    """Metaclass of the stand-in classes: any class attribute (e.g.
    ``PeftModel.from_pretrained``) raises the ImportError that names the fix."""

    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        raise ImportError(_message(f"{cls.__name__}.{attr}"), name="peft")


def _unavailable_class(name: str) -> type:
    def __new__(cls, *args, **kwargs):
        raise ImportError(_message(name), name="peft")

    # A class that is never instantiated: isinstance(x, it) is False for every x.
    return _Unavailable(name, (), {
        "__new__": __new__,
        "__module__": __name__,
        "__qualname__": f"unavailable.{name}",
        "__doc__": f"Stand-in for peft.{name} while peft is not installed; nothing is an instance of it.",
    })


PeftModelUnavailable = _unavailable_class("PeftModel")
PeftConfigUnavailable = _unavailable_class("PeftConfig")


def get_peft_model_unavailable(model, peft_config, *args, **kwargs):
    raise ImportError(_message("get_peft_model"), name="peft")


def _stand_in(name: str):
    return {
        "PeftModel": PeftModelUnavailable,
        "PeftConfig": PeftConfigUnavailable,
        "get_peft_model": get_peft_model_unavailable,
    }[name]


def _wrap_init(original):
    try:
        signature = inspect.signature(original)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if signature is not None:
            try:
                bound = signature.bind(self, *args, **kwargs)
            except TypeError:
                bound = None  # a bad call: let TRL report it as it always did
            if bound is not None and bound.arguments.get("peft_config") is not None:
                # Before TRL's __init__ loads the model: nothing is lost yet.
                raise ImportError(_message(f"{type(self).__name__}(peft_config=...)"), name="peft")
        return original(self, *args, **kwargs)

    return __init__


# -- probe ----------------------------------------------------------------------------


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


def _functions(module: types.ModuleType) -> Iterator[Tuple[str, types.FunctionType]]:
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


def scan(module: types.ModuleType) -> Tuple[Dict[str, List[str]], Dict[str, List[str]]]:
    """``(unguarded, guarded)``: PEFT name -> functions of ``module`` that load
    it as a global although the module does not define it."""
    namespace = vars(module)
    unguarded: Dict[str, List[str]] = {}
    guarded: Dict[str, List[str]] = {}
    for qualname, fn in _functions(module):
        loads = set(_global_loads(fn.__code__))
        missing = [n for n in PEFT_NAMES if n in loads and n not in namespace and not hasattr(builtins, n)]
        for name in missing:
            (guarded if GUARD in loads else unguarded).setdefault(name, []).append(qualname)
    return unguarded, guarded


def _where(refs: Dict[str, List[str]]) -> str:
    return "; ".join(f"{name} in {', '.join(sorted(fns))}" for name, fns in refs.items())


def probe(module: types.ModuleType):
    unguarded, guarded = scan(module)
    if not unguarded:
        if guarded:
            return not_needed(f"every use of an undefined PEFT name is guarded by {GUARD}() ({_where(guarded)})")
        if _peft_importable():
            return not_needed("peft is installed: the module defines the PEFT names it uses")
        return not_needed("no function of the module uses an undefined PeftModel/PeftConfig/get_peft_model")
    if _peft_importable():
        return undecided(
            f"the module uses undefined {_where(unguarded)}, yet peft is importable (transformers' "
            "is_peft_available() said no when trl was imported); PEFT models are not hidden"
        )
    return needed(f"peft is not installed and the module uses undefined {_where(unguarded)}")


def apply(module: types.ModuleType, patcher) -> None:
    unguarded, _ = scan(module)
    for name in unguarded:
        patcher.replace(module, name, _stand_in(name))
    trainer = getattr(module, "GRPOTrainer", None)
    if isinstance(trainer, type):
        try:
            takes_peft_config = "peft_config" in inspect.signature(trainer.__init__).parameters
        except (TypeError, ValueError):
            takes_peft_config = False
        if takes_peft_config:
            patcher.wrap(trainer, "__init__", _wrap_init)


# The versions named above, inside the window (the probe decides) or outside it: tests/test_windows.py.
VERSIONS = {"trl": {"inside": ["0.14.0", "0.15.0.dev0", "0.15.2", "0.16.0.dev0"], "outside": ["0.16.0"]}}


PATCH = Patch(
    id="peft-optional",
    summary="GRPO without peft installed: 'is this a PeftModel?' is no, and peft_config raises a clear ImportError early",
    upstream=(
        "https://github.com/huggingface/trl/issues/2849 (PeftModel NameError from PR #2725, fixed by PR #2850/#2818 "
        "before 0.15.0); get_peft_model NameError fixed by PR #2848 in 0.16.0"
    ),
    module="trl.trainer.grpo_trainer",
    target="GRPOTrainer",  # the class: __init__ can never be missing (it is inherited)
    # main reported 0.16.0.dev0 for five days before PR #2848 added the guard: the probe decides.
    requires={"trl": affected("0.14.0", "0.16.0")},
    probe=probe,
    apply=apply,
    remove_when="trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR #2848)",
)
