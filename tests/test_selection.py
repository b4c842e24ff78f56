"""Which tests each tox env runs (TRL_COMPAT_TESTS, tests/conftest.py): a matrix cell leaves out
the stack-free tests, which the notrl cell runs once, and there a stack-free test may not skip."""

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STACK_FREE_FILE = "tests/engine/test_logs.py"
MIXED_FILE = "tests/engine/test_probe_text.py"  # stack-free, one test marked every_cell
FILES = [STACK_FREE_FILE, MIXED_FILE, "tests/engine/test_reporting.py"]


def conftest():
    spec = importlib.util.spec_from_file_location("tests_conftest_for_selection", os.path.join(ROOT, "tests", "conftest.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pytest_run(*args, tests=None, extra_env=None):
    env = {k: v for k, v in os.environ.items() if k != "TRL_COMPAT_TESTS"}
    if tests is not None:
        env["TRL_COMPAT_TESTS"] = tests
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def collected(tests):
    out = pytest_run("--collect-only", "-q", *FILES, tests=tests)
    assert out.returncode in (0, 5), out.stdout + out.stderr  # 5: nothing collected
    ids = [line for line in out.stdout.splitlines() if "::" in line]
    return {path: [i.split("::", 1)[1] for i in ids if i.startswith(path + "::")] for path in FILES}


def test_every_listed_path_exists():
    module = conftest()
    for path in module.STACK_FREE + module.PACKAGE:
        assert os.path.exists(os.path.join(ROOT, path)), f"{path} is listed in tests/conftest.py but does not exist"


def test_a_cell_leaves_out_the_stack_free_tests_but_those_marked_every_cell():
    everything = collected("all")
    assert all(everything.values()), everything
    assert collected("cell+stack-free") == everything
    cell = collected("cell")
    assert cell[STACK_FREE_FILE] == []
    assert cell[MIXED_FILE] == ["test_transformers5_warnings_issued_in_code_is_seen"]
    assert cell["tests/engine/test_reporting.py"] == everything["tests/engine/test_reporting.py"]
    assert collected("package") == {path: [] for path in FILES}


def test_an_unknown_value_is_refused():
    out = pytest_run("--collect-only", "-q", STACK_FREE_FILE, tests="cells")
    assert out.returncode == 4 and "TRL_COMPAT_TESTS='cells'" in out.stderr, out.stdout + out.stderr


@pytest.mark.parametrize("tests, failed", [("cell+stack-free", True), ("all", False)])
def test_a_stack_free_test_that_skips_in_its_only_env_fails(tmp_path, tests, failed):
    (tmp_path / "skip_every_test.py").write_text(
        "import pytest\n\n\ndef pytest_runtest_setup(item):\n    pytest.skip('skipped by the test')\n"
    )
    extra = {"PYTHONPATH": os.pathsep.join([str(tmp_path)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    out = pytest_run("-q", "-p", "skip_every_test", STACK_FREE_FILE, tests=tests, extra_env=extra)
    if failed:
        assert out.returncode == 1 and "is stack-free (tests/conftest.py STACK_FREE)" in out.stdout, out.stdout
        assert "skipped by the test" in out.stdout
    else:
        assert out.returncode == 0 and "skipped" in out.stdout, out.stdout
