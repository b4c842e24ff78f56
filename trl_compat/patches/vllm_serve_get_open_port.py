"""vllm-serve-get-open-port: with vLLM >= 0.14, ``trl vllm-serve`` dies at start:
``ImportError: cannot import name 'get_open_port' from 'vllm.utils'``.

The bug: ``trl/scripts/vllm_serve.py`` imports ``from vllm.utils import get_open_port`` at module
level (TRL 0.17.0 - 0.27.2; it picks the port of the weight-sync process group). vLLM 0.11.1 moved
the function to ``vllm.utils.network_utils`` and kept the old name with a deprecation warning up to
0.13; 0.14.0 dropped it (the version table of TRL PR #4883). TRL PR #4883 (ba0532323), released in
0.28.0, imports it from ``vllm.utils.network_utils`` on vLLM >= 0.11.1. Only the server process
is affected (the trainer never imports the name): the patch must be active there, through
``trl-compat run -- trl vllm-serve ...`` or ``TRL_COMPAT_AUTO=1``. With TRL <= 0.26.2 the same
import line is preceded by vllm-guided-decoding-import's (vLLM >= 0.12): both apply.

Probe: the trigger is ``vllm.utils``, which TRL's import line loads before it reads the name; the
probe reads ``trl.scripts.vllm_serve``'s source file without importing it
(``_helpers.source.module_code``: it is usually being imported at that moment): "needed" when it
has ``from vllm.utils import get_open_port`` and no ``vllm.utils.network_utils`` (0.28+ has both,
version-gated) and the loaded ``vllm.utils`` lacks ``get_open_port``; "not needed" when vLLM still
has it; "undecided" when the source cannot be read.

Fix: ``vllm.utils.get_open_port`` is set to ``vllm.utils.network_utils.get_open_port``, the
function vLLM 0.14 itself uses, so TRL's import line finds it.

Run time: load-bearing: errors propagate. What this patch's wrappers do is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL < 0.28.0 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import functools
import importlib

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._engine.patch import SourceUnavailable
from trl_compat._helpers.source import module_code

SERVE_MODULE = "trl.scripts.vllm_serve"
OLD_IMPORT = "from vllm.utils import get_open_port"


def probe(module):
    try:
        source = module_code(SERVE_MODULE)
    except ModuleNotFoundError:
        return not_needed(f"this TRL has no {SERVE_MODULE} (trl vllm-serve came in 0.16)")
    except SourceUnavailable as exc:
        return undecided(str(exc))
    if OLD_IMPORT not in source or "vllm.utils.network_utils" in source:
        return not_needed(f"{SERVE_MODULE} does not import get_open_port from vllm.utils alone")
    if hasattr(module, "get_open_port"):
        return not_needed("this vllm.utils still exports get_open_port")
    return needed(f"{SERVE_MODULE} imports get_open_port from vllm.utils, which vLLM >= 0.14 removed")


def apply(module, patcher):
    moved = importlib.import_module("vllm.utils.network_utils").get_open_port

    @functools.wraps(moved)  # a function of ours: the Patcher marks it, not vLLM's own
    def get_open_port(*args, **kwargs):
        return moved(*args, **kwargs)

    patcher.replace(module, "get_open_port", get_open_port)
