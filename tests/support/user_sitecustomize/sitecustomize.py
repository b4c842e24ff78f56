"""A user's own ``sitecustomize``, for tests/activation/test_activation.py: on ``PYTHONPATH`` behind
``trl-compat run``'s bootstrap, it must still run (the bootstrap chains to it).

It sets ``TRL_COMPAT_TEST_SITECUSTOMIZE=ran`` and, when ``TRL_COMPAT_TEST_REPORT_DIR`` is set,
writes ``<dir>/<pid>.json`` at exit: ``sys.argv``, whether trl_compat is imported, how
(``trl_compat.activation.this_process()``), and the patch statuses. That is how the test sees
inside processes whose code it does not own (``trl grpo``'s training script).
"""

import atexit
import json
import os
import sys

os.environ["TRL_COMPAT_TEST_SITECUSTOMIZE"] = "ran"


def _report():
    result = {"argv": sys.argv, "trl_compat": "trl_compat" in sys.modules}
    if result["trl_compat"]:
        import trl_compat.activation

        result["how"] = trl_compat.activation.this_process()
        result["statuses"] = {p.id: p.status for p in trl_compat.report()}
    with open(os.path.join(os.environ["TRL_COMPAT_TEST_REPORT_DIR"], f"{os.getpid()}.json"), "w") as fh:
        json.dump(result, fh)


if os.environ.get("TRL_COMPAT_TEST_REPORT_DIR"):
    atexit.register(_report)
