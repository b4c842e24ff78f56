"""peft-optional: GRPO without peft installed must not die on PEFT names.

Main-branch builds: 0.15.0.dev0/0.16.0.dev0 git installs from before PR #2848 have the bug too.

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

Where it shows: trl >=0.14.0.dev0,<=0.16.0.dev0 when peft is not importable.

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

Parts: ``scan`` (the bytecode walk), ``stand_ins`` (what is bound, and the ``peft_config`` check).

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat drops support for TRL < 0.16.0 (and 0.16.0.dev0 installs older than PR
#2848) (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import importlib.util
import inspect
import sys
import types

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.trainer_init import around_init
from trl_compat.patches.peft_optional.scan import GUARD, PEFT_NAMES, scan, where  # noqa: F401
from trl_compat.patches.peft_optional.stand_ins import (  # noqa: F401 - the stand-ins, for tests and tools
    INSTALL_HINT,
    PeftConfigUnavailable,
    PeftModelUnavailable,
    get_peft_model_unavailable,
    refuse_peft_config,
    stand_in,
)


def _peft_importable() -> bool:
    """Whether ``import peft`` could succeed, without importing it."""
    if "peft" in sys.modules:
        return sys.modules["peft"] is not None  # None blocks the import
    try:
        return importlib.util.find_spec("peft") is not None
    except (ImportError, ValueError):
        return False


def probe(module: types.ModuleType):
    unguarded, guarded = scan(module)
    if not unguarded:
        if guarded:
            return not_needed(f"every use of an undefined PEFT name is guarded by {GUARD}() ({where(guarded)})")
        if _peft_importable():
            return not_needed("peft is installed: the module defines the PEFT names it uses")
        return not_needed("no function of the module uses an undefined PeftModel/PeftConfig/get_peft_model")
    if _peft_importable():
        return undecided(
            f"the module uses undefined {where(unguarded)}, yet peft is importable (transformers' "
            "is_peft_available() said no when trl was imported); PEFT models are not hidden"
        )
    return needed(f"peft is not installed and the module uses undefined {where(unguarded)}")


def apply(module: types.ModuleType, patcher) -> None:
    unguarded, _ = scan(module)
    for name in unguarded:
        patcher.replace(module, name, stand_in(name))
    trainer = getattr(module, "GRPOTrainer", None)
    if isinstance(trainer, type):
        try:
            takes_peft_config = "peft_config" in inspect.signature(trainer.__init__).parameters  # type: ignore[misc]  # the class's own
        except (TypeError, ValueError):
            takes_peft_config = False
        if takes_peft_config:
            around_init(before=refuse_peft_config, complete=True)(module, patcher)
