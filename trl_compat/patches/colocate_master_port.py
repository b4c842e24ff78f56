"""colocate-master-port: two colocated vLLM runs on one host rendezvous on the same fixed port.

The bug (PR #4057, ``008c7ad9a``, fixed in 0.24.0): with ``vllm_mode="colocate"``,
``GRPOTrainer.__init__`` sets the variables vLLM's ``external_launcher`` reads to open its process
group, and where ``MASTER_PORT`` is unset it takes ``os.environ.get("MASTER_PORT", "12345")``
(from 0.20.0, PR #3723 ``640a9f391``; 0.18 - 0.19 set none of them). A run started by plain ``python``
(no ``torchrun``/``accelerate launch``, which set the port) therefore binds 12345; a second such run
on the same host, a notebook's second trainer while another job holds the port, or any other server
on 12345 makes ``init_process_group`` fail with ``EADDRINUSE`` ("The server socket has failed to
listen on any local network address") when vLLM starts.

Upstream fix: ``trl.trainer.utils.ensure_master_addr_port()``: an unset ``MASTER_PORT`` becomes a
port that is free (29500, 23456, 12355, 12345, else one the system gives).

Probe: ``GRPOTrainer.__init__`` holds ``os.environ.get("MASTER_PORT", "12345")``: "needed";
``ensure_master_addr_port`` there, or no ``MASTER_PORT`` at all (0.14 - 0.19): "not needed"; another
way of setting it: "undecided".

Fix: before TRL's ``__init__``, a colocated run (``use_vllm`` and ``vllm_mode="colocate"``) whose
``MASTER_PORT`` is unset gets a port the system reports free, as 0.24.0 chooses one; TRL's own line
then keeps it. A port the user or a launcher set is left alone.

Run time: load-bearing: errors propagate. What this patch's wrapper does is the fix itself: falling
back to TRL's own code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: trl_compat no longer supports TRL 0.20 - 0.23 (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import os
import socket

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import code
from trl_compat._helpers.trainer_init import around_init

BUGGY = 'os.environ.get("MASTER_PORT", "12345")'
FIXED = "ensure_master_addr_port"
PORT = "MASTER_PORT"


def probe(module):
    source = code(module.GRPOTrainer.__init__)
    if BUGGY in source:
        return needed(
            "GRPOTrainer.__init__ falls back to MASTER_PORT 12345 for colocated vLLM: a second run on the host, or "
            "anything else on that port, fails to open vLLM's process group (EADDRINUSE); an unset port becomes a "
            "free one before TRL's __init__"
        )
    if FIXED in source or PORT not in source:
        return not_needed("GRPOTrainer.__init__ picks a free MASTER_PORT (TRL 0.24) or sets none")
    return undecided("GRPOTrainer.__init__ sets MASTER_PORT in a way this patch does not know")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def _colocated(arguments) -> bool:
    args = arguments.get("args")
    return bool(getattr(args, "use_vllm", False)) and getattr(args, "vllm_mode", None) == "colocate"


def _free_port_where_unset(trainer, arguments) -> None:
    if _colocated(arguments) and not os.environ.get(PORT):
        os.environ[PORT] = str(free_port())


apply = around_init(before=_free_port_where_unset)
