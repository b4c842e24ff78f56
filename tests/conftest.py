import importlib
import os
import uuid

import pytest

from unpatched import without_patch

# No test may reach the Hugging Face Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_DISABLED", "true")


@pytest.fixture
def unpatched():
    """``with unpatched("patch-id"): ...`` runs the block without that patch."""
    return without_patch


# vLLM >= 0.8 (and the stand-in installed as vLLM 0.8.5 / 0.9.1) writes its engine choice into
# os.environ when building an engine, and the vllm-v1-engine patch leaves its VLLM_USE_V1=0 set:
# without this, which engine a test gets, and what a `python -m trl_compat` subprocess reports,
# would depend on the tests that ran before it.
VLLM_ENGINE_VARS = ("VLLM_USE_V1", "VLLM_ENABLE_V1_MULTIPROCESSING")
# TRL >= 0.18's colocate mode writes torch.distributed's rendezvous variables into os.environ for the
# whole process; a later trainer's TrainingArguments then reads LOCAL_RANK=0 as a distributed launch
# and accelerate wraps the model in DDP (with TRL 0.22/0.23's gradient checkpointing and LoRA:
# "Expected to mark a variable ready only once"). Each test gets the environment it started with.
RENDEZVOUS_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def code_module(tmp_path, monkeypatch):
    """``code_module(source)``: ``source`` written to a fresh module under ``tmp_path`` and imported
    (a probe's test reads TRL-like code through ``inspect``, which needs a real file)."""

    def load(source):
        name = "tcprobe_" + uuid.uuid4().hex[:8]
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        return importlib.import_module(name)

    return load


@pytest.fixture(autouse=True)
def _vllm_engine_choice_per_test():
    saved = {name: os.environ.get(name) for name in VLLM_ENGINE_VARS + RENDEZVOUS_VARS}
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# Which tests a tox env runs: TRL_COMPAT_TESTS, set per env in tox.ini.
#   all (or unset)   every test: a local run
#   cell             a matrix cell: every test but the stack-free ones and tests/package
#   cell+stack-free  the notrl cell: those and the stack-free tests, which run nowhere else; so
#                    a stack-free test (or module) that skips here fails instead
#   package          tox -e package: tests/package only
# The stack-free tests read nothing of the installed stack (the engine on synthetic packages, the
# version gate on given versions, probes on code written in the test): their outcome is the same in
# every cell, so they run once instead of in each. A file not listed here runs in every cell, a new
# one included. A test in a listed file that reads the stack (TRL, torch, transformers, installed
# metadata) is marked ``@pytest.mark.every_cell``; one that skips in notrl fails there until it is.
STACK_FREE = (
    "tests/engine/test_lifecycle.py",
    "tests/engine/test_logs.py",
    "tests/engine/test_patch_modules.py",
    "tests/engine/test_patcher.py",
    "tests/engine/test_probe_text.py",
    "tests/engine/test_tensor_devices.py",
    "tests/engine/test_versions.py",
    "tests/engine/test_windows.py",
    "tests/guard/test_guard_units.py",
    "tests/guard/test_floors.py",
    "tests/helpers/test_arguments.py",
    "tests/helpers/test_source.py",
    "tests/helpers/test_zero3.py",
    "tests/test_release.py",
    "tests/test_matrix.py",
    "tests/test_ledger.py",
    "tests/test_selection.py",
)
PACKAGE = ("tests/package",)
TESTS_VAR = "TRL_COMPAT_TESTS"
TEST_SETS = ("all", "cell", "cell+stack-free", "package")


def chosen_tests(config):
    chosen = os.environ.get(TESTS_VAR, "").strip() or "all"
    if chosen not in TEST_SETS:
        raise pytest.UsageError(f"{TESTS_VAR}={chosen!r}: expected one of {', '.join(TEST_SETS)}")
    return chosen


def _under(path, config, prefixes):
    try:
        rel = path.resolve().relative_to(config.rootpath.resolve()).as_posix()
    except ValueError:  # outside the tree: not one of ours, runs everywhere
        return False
    return any(rel == p or rel.startswith(p + "/") for p in prefixes)


def runs_only_here(item):
    """A stack-free test in the env that runs them: it runs in no other."""
    return (
        chosen_tests(item.config) == "cell+stack-free"
        and _under(item.path, item.config, STACK_FREE)
        and item.get_closest_marker("every_cell") is None
    )


# tox.ini's cells: the cell's `python -m trl_compat --json` report, written by this session before any test
# is collected (the state a fresh interpreter reports: nothing but trl_compat and the report's own imports
# done), instead of by one more interpreter importing torch, transformers and TRL (20 - 40 s a cell).
CELL_REPORT = "TRL_COMPAT_CELL_REPORT"


def write_cell_report():
    # popped: a pytest or GRPO launched by a test inherits the environment and must not write it again
    path = os.environ.pop(CELL_REPORT, None)
    if not path:
        return
    import json

    from trl_compat.__main__ import collect

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    report = collect()
    with open(path, "w") as fh:
        json.dump(report, fh, indent=2)


def pytest_configure(config):
    write_cell_report()
    chosen_tests(config)
    config.addinivalue_line(
        "markers",
        "every_cell: in a STACK_FREE file (tests/conftest.py), a test that reads the installed stack and so runs in every matrix cell",
    )


def pytest_collection_modifyitems(config, items):
    chosen = chosen_tests(config)
    if chosen == "all":
        return

    def wanted(item):
        if _under(item.path, config, PACKAGE):
            return chosen == "package"
        if chosen == "package":
            return False
        return (
            chosen == "cell+stack-free"
            or not _under(item.path, config, STACK_FREE)
            or item.get_closest_marker("every_cell") is not None
        )

    keep = [item for item in items if wanted(item)]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if not wanted(item)])
        items[:] = keep


NOT_RUN_ELSEWHERE = (
    "{what} is stack-free (tests/conftest.py STACK_FREE), so it runs in this env only, "
    "but it was skipped here ({why}): mark the test @pytest.mark.every_cell if it needs "
    "the installed stack, or make it run here"
)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.skipped and not hasattr(report, "wasxfail") and runs_only_here(item):
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = NOT_RUN_ELSEWHERE.format(what=item.nodeid, why=why)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if (
        report.skipped
        and isinstance(collector, pytest.Module)
        and chosen_tests(collector.config) == "cell+stack-free"
        and _under(collector.path, collector.config, STACK_FREE)
    ):
        why = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = NOT_RUN_ELSEWHERE.format(what=collector.nodeid, why=why)


# The off-policy guard's counts for this session (TRL_COMPAT_GUARD=strict in every matrix cell, tox.ini):
# written beside the junit XML, as guard/<cell>.json (not <cell>.json: that name is the cell's report),
# for matrix/write_results.py. Runs in this process only: GRPO runs in subprocesses (2-process launches)
# are guarded too but not counted here.
GUARD_STATS_DIR = "guard"


def guard_stats_path(config):
    import pathlib

    xml = getattr(config.option, "xmlpath", None)
    if not xml:
        return None
    xml = pathlib.Path(xml)
    return xml.parent / GUARD_STATS_DIR / (xml.stem + ".json")


def pytest_sessionfinish(session, exitstatus):
    import json
    import sys

    path = guard_stats_path(session.config)
    guard = sys.modules.get("trl_compat.guard")
    if path is None or guard is None:
        return
    stats = dict(guard.stats(), mode=guard.mode())
    stats["unexpected"] = [a.line() for a in guard.alarms() if not a.observed][:20]  # strict mode raised these
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(stats, indent=1) + "\n")
