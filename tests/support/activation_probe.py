"""What trl_compat's zero-code activation did in this process, for tests/activation/test_activation.py.

    python tests/support/activation_probe.py [--spawn]

Prints one line ``PROBE|{json}``: whether trl_compat was imported before this script ran
(this script never imports it), how (``trl_compat.activation.this_process()``), the patch
statuses, which heavy modules (torch, trl, ...) start-up had imported, ``PYTHONPATH`` and the
``sitecustomize`` in effect. With ``--spawn``, the same for a ``multiprocessing`` child started
with the spawn method (a fresh interpreter, as vLLM and ``trl vllm-serve`` start theirs).
"""

import json
import multiprocessing
import os
import sys

HEAVY = ("torch", "trl", "transformers", "deepspeed", "accelerate", "vllm", "peft", "datasets")


def facts():
    found = {
        "pid": os.getpid(),
        "trl_compat": "trl_compat" in sys.modules,
        "heavy": [m for m in HEAVY if m in sys.modules],
        "pythonpath": os.environ.get("PYTHONPATH"),
        "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
        "marker": os.environ.get("TRL_COMPAT_TEST_SITECUSTOMIZE"),
    }
    if found["trl_compat"]:
        import trl_compat
        import trl_compat.activation

        found["how"] = trl_compat.activation.this_process()
        found["file"] = trl_compat.__file__
        found["statuses"] = {p.id: p.status for p in trl_compat.report()}
    return found


def child(queue):
    queue.put(facts())


if __name__ == "__main__":
    out = {"main": facts()}
    if "--spawn" in sys.argv:
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        proc = ctx.Process(target=child, args=(queue,))
        proc.start()
        out["spawned"] = queue.get(timeout=300)
        proc.join(60)
        out["spawn_exitcode"] = proc.exitcode
    print("PROBE|" + json.dumps(out), flush=True)
