"""requests-optional: TRL 0.28.0 - 1.14.1 import ``requests.adapters`` and ``urllib3`` at the
top of ``trl/generation/vllm_client.py``, which the GRPO trainer imports on every path; without
``requests`` installed (a user's install today: transformers 5, datasets >= 5.1), ``from trl import
GRPOTrainer`` fails.

* Everywhere: the import guard on a synthetic module (placeholders bound, line numbers kept).
* Every cell with TRL: the probe on the real source file (which releases import at the top level;
  "not needed" where requests is installed).
* The user's-install cell ``trl1.9.2-tf5.24.0-user`` (no requests, as pip resolves it today): in fresh
  interpreters, the import fails with the patch switched off and succeeds with it; ``VLLMClient()``
  names the missing package; ``import requests`` still fails; GRPO trains two steps, full and LoRA.

No other cell can show it: hiding ``requests`` where it is installed breaks datasets < 5.1 (its
``load.py`` imports it) and transformers 4 before TRL's module is reached, which is why the bug
stayed hidden in cells resolved as of their release's day.
"""

import ast
import os
import subprocess
import sys

from trl_compat.patches import requests_optional as patch_module

import pytest
from packaging.version import Version

from versions import installed
from workers import SUPPORT

PATCH_ID = "requests-optional"
TRL = installed("trl")
TOP_LEVEL = TRL is not None and Version("0.28.0") <= TRL < Version("1.14.2")
REQUESTS = installed("requests") is not None
NO_REQUESTS_CELL = TOP_LEVEL and not REQUESTS
MESSAGE = "No module named 'requests'"

SYNTHETIC = """\
import json
from absent_pkg.adapters import HTTPAdapter
from absent_pkg_two.util.retry import Retry as R
import absent_pkg.sessions

if False:
    from absent_pkg import nothing


def fails():
    raise RuntimeError("line 11")
"""


def compile_guarded(source, missing):
    tree = ast.parse(source)
    original = [statement.lineno for statement in tree.body]
    guarded = patch_module.guard_imports(tree, missing)
    assert [statement.lineno for statement in guarded.body] == original  # every statement where it was
    return compile(guarded, "<synthetic>", "exec")


def test_guarded_imports_skip_missing_packages_and_keep_line_numbers(monkeypatch):
    monkeypatch.setattr(patch_module, "OPTIONAL_PACKAGES", ("absent_pkg", "absent_pkg_two"))
    namespace = {}
    exec(compile_guarded(SYNTHETIC, ["absent_pkg", "absent_pkg_two"]), namespace)
    assert namespace["json"].__name__ == "json"  # an installed package's import is left as it is
    # the missing packages' names are left unbound, as TRL 1.14.2 leaves them without requests
    assert not {"HTTPAdapter", "R", "absent_pkg", "nothing"} & set(namespace)
    with pytest.raises(RuntimeError) as raised:
        namespace["fails"]()
    assert raised.traceback[-1].lineno + 1 == 11  # pytest counts from 0: the function's line, unchanged
    tree = ast.parse(SYNTHETIC)
    statements = patch_module.top_level_imports(tree)
    assert [name for s in statements for name in patch_module.bound_names(s)] == ["HTTPAdapter", "R", "absent_pkg"]


def test_placeholders_name_the_missing_package():
    adapter = patch_module.placeholder("requests", "HTTPAdapter")
    assert adapter.__name__ == "HTTPAdapter"
    with pytest.raises(ImportError, match=r"requests is not installed\. Please install it with `pip install requests`"):
        adapter(max_retries=3)


def test_unguarded_synthetic_import_fails():
    """The control: the same module without the guard does not import."""
    with pytest.raises(ModuleNotFoundError, match="absent_pkg"):
        exec(compile(SYNTHETIC, "<synthetic>", "exec"), {})


def test_only_the_optional_packages_top_level_imports_are_seen():
    tree = ast.parse(
        "import torch\nfrom requests.adapters import HTTPAdapter\nif x:\n    import requests\nfrom urllib3.util.retry import Retry\n"
    )
    assert [ast.unparse(s) for s in patch_module.top_level_imports(tree)] == [
        "from requests.adapters import HTTPAdapter",
        "from urllib3.util.retry import Retry",
    ]


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_the_client_modules_top_level_imports_in_this_release():
    """What the probe reads where a package is missing, read in every cell: 0.28.0 - 1.14.1 import both
    at the module's top level, 1.14.2 inside ``if is_requests_available():``, < 0.28 has no module."""
    if TRL < Version("0.28.0"):
        with pytest.raises(ModuleNotFoundError):
            patch_module.module_syntax(patch_module.TARGET)
        return
    statements = patch_module.top_level_imports(patch_module.module_syntax(patch_module.TARGET))
    expected = ["from requests.adapters import HTTPAdapter", "from urllib3.util.retry import Retry"] if TOP_LEVEL else []
    assert [ast.unparse(s) for s in statements] == expected


@pytest.mark.skipif(TRL is None, reason="trl is not installed")
def test_probe_reads_the_client_module_of_this_release():
    verdict = patch_module.probe(sys.modules.get("trl"))
    if REQUESTS and patch_module.installed("urllib3"):
        assert not verdict.needed and "requests and urllib3 are installed" in verdict.reason, verdict
    elif TRL < Version("0.28.0"):
        assert not verdict.needed and ("has no trl.generation.vllm_client" in verdict.reason or "only where" in verdict.reason)
    elif TOP_LEVEL:
        assert "runs `from requests.adapters import HTTPAdapter; from urllib3.util.retry import Retry` at import" in verdict.reason
        assert verdict.needed is not REQUESTS, verdict
    else:
        assert not verdict.needed and "only where they are installed" in verdict.reason, verdict


CHILD = """
import trl_compat
from trl import GRPOTrainer
print("STATUS", trl_compat.status({patch_id!r}))
from trl.generation.vllm_client import VLLMClient
try:
    VLLMClient()
except ImportError as exc:
    print("CLIENT", exc)
try:
    import requests
    print("REQUESTS importable")
except ImportError:
    print("REQUESTS absent")
"""


def child(disable=""):
    code = CHILD.format(patch_id=PATCH_ID)
    env = dict(os.environ, TRL_COMPAT_DISABLE=disable)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=SUPPORT, capture_output=True, text=True, timeout=600)


def check_unpatched(out):
    assert out.returncode != 0, out.stdout
    assert MESSAGE in out.stderr and "trl/generation/vllm_client.py" in out.stderr, out.stderr[-3000:]


def check_patched(out):
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert "STATUS applied" in lines, out.stdout
    # TRL's own check in VLLMClient.__init__, as 1.14.2 words it
    assert "CLIENT requests is not installed. Please install it with `pip install requests`." in lines, out.stdout
    assert "REQUESTS absent" in lines, out.stdout


no_requests_cell = pytest.mark.skipif(
    not NO_REQUESTS_CELL, reason="TRL 0.28.0 - 1.14.1 without requests installed (the trl1.9.2-tf5.24.0-user cell)"
)


@no_requests_cell
def test_users_install_unpatched_import_fails():
    check_unpatched(child(disable=PATCH_ID))


@no_requests_cell
def test_users_install_patched_import_and_client_error():
    check_patched(child())


@no_requests_cell
def test_placeholders_in_the_client_module_and_exact_revert(unpatched):
    import trl.generation.vllm_client as client

    finders = [f for f in sys.meta_path if isinstance(f, patch_module.Finder)]
    assert len(finders) == 1 and client.HTTPAdapter.__name__ == "HTTPAdapter" and client.Retry.__name__ == "Retry"
    with pytest.raises(ImportError, match="requests is not installed"):
        client.HTTPAdapter()
    with unpatched(PATCH_ID):
        # as TRL 1.14.2 leaves the module without requests: the names unbound, no finder left
        assert not hasattr(client, "HTTPAdapter") and not hasattr(client, "Retry")
        assert not [f for f in sys.meta_path if isinstance(f, patch_module.Finder)]
    assert client.HTTPAdapter.__name__ == "HTTPAdapter"


TRAIN = """
import json, tempfile
import trl_compat
import grpo_run
out = {}
for peft in (False, True):
    trainer, history = grpo_run.run_grpo(tempfile.mkdtemp(), steps=2, peft=peft)
    changed = bool(grpo_run.changed_trainable(trainer))
    out["lora" if peft else "full"] = [grpo_run.finite_losses(history), changed, trainer.state.global_step]
out["status"] = trl_compat.status(%r)
print("RESULT", json.dumps(out))
"""


@no_requests_cell
def test_grpo_trains_full_and_lora_without_requests():
    out = subprocess.run([sys.executable, "-c", TRAIN % PATCH_ID], cwd=SUPPORT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    import json

    result = json.loads(next(line for line in out.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT ") :])
    assert result == {"full": [True, True, 2], "lora": [True, True, 2], "status": "applied"}, result
