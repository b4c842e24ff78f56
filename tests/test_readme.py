"""README's patch table is the registry's, rendered by tools/write_readme_table.py (no TRL needed)."""

import glob
import importlib.util
import os
import re

from trl_compat.patches import PATCHES

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOL = os.path.join(ROOT, "tools", "write_readme_table.py")
README = os.path.join(ROOT, "README.md")
# the release README's requirements line pins (tests/test_release.py holds it to its commit)
PINNED_RELEASE = re.compile(r"^trl-compat @ git\+[^@\n]+@[0-9a-f]{40}  # release (\S+)$", re.M)
# trl_compat's own output shown in an example: "trl_compat 0.5.0: fixes ...", "trl-compat 0.5.0"
EXAMPLE_VERSION = re.compile(r"\btrl[-_]compat v?(\d+\.\d+\.\d+(?:\.dev\d+)?)")
FENCED = re.compile(r"^```[^\n]*\n(.*?)^```", re.M | re.S)


@pytest.fixture(scope="module")
def tool():
    if not os.path.isfile(TOOL):
        pytest.skip("tools/write_readme_table.py is not in this tree (an sdist carries no tools/)")
    spec = importlib.util.spec_from_file_location("write_readme_table", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_table_is_the_registrys(tool):
    with open(README, encoding="utf-8") as handle:
        current = tool.current_block(handle.read())
    assert current == tool.block(PATCHES), "README.md's patch table is stale: run python tools/write_readme_table.py"


def test_every_patch_has_a_row(tool):
    table = tool.table(PATCHES)
    for patch in PATCHES:
        assert f"| `{patch.id}` |" in table


def test_check_fails_on_a_stale_readme_and_says_how_to_regenerate(tool, tmp_path, capsys):
    stale = tool.block(PATCHES).replace(f"`{PATCHES[0].id}`", "`a-renamed-patch`")
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{stale}\n\nafter\n", encoding="utf-8")
    assert tool.main(["--check", "--readme", str(readme)]) == 1
    assert "python tools/write_readme_table.py" in capsys.readouterr().err
    assert tool.main(["--readme", str(readme)]) == 0
    rewritten = readme.read_text(encoding="utf-8")
    assert rewritten == f"# title\n\n{tool.block(PATCHES)}\n\nafter\n"
    assert tool.main(["--check", "--readme", str(readme)]) == 0


def test_symptom_is_shown_and_summary_only_while_it_is_empty(tool):
    with_symptom = PATCHES[0].replace(symptom="ImportError: the error a user sees")
    without = PATCHES[0].replace(symptom="")
    assert "ImportError: the error a user sees" in tool.table([with_symptom])
    assert PATCHES[0].summary not in tool.table([with_symptom])
    assert without.summary.split()[0] in tool.table([without])


@pytest.mark.parametrize(
    "requires, shown",
    [
        ({"trl": ">=0.14.0.dev0,<0.16.0a0", "transformers": ">=5.0.0.dev0"}, "TRL 0.14.0 – 0.15.x; transformers ≥ 5.0"),
        ({"transformers": ">=4.52.0.dev0", "trl": ">=0.15.0.dev0,<0.17.0a0"}, "TRL 0.15.0 – 0.16.x; transformers ≥ 4.52"),
        ({"trl": ">=0.14.0.dev0,<0.15.0a0"}, "TRL 0.14.x"),
        ({"trl": ">=0.15.0.dev0,<0.15.1a0"}, "TRL 0.15.0"),
        ({"trl": ">=0.17.0.dev0,<0.18.2a0"}, "TRL 0.17.0 – 0.18.1"),
        ({"trl": ">=0.14.0.dev0,<0.16.0a0", "deepspeed": ">=0"}, "TRL 0.14.0 – 0.15.x; DeepSpeed installed"),
        ({"trl": ">=0.14.0.dev0,<0.16.0a0", "vllm": ">=0.8.0.dev0"}, "TRL 0.14.0 – 0.15.x; vLLM ≥ 0.8"),
        ({"peft": ">=0.0.dev0"}, "peft installed"),
        ({"trl": ">=0.14.0,<=0.17.0"}, "TRL >=0.14.0,<=0.17.0"),  # a form it does not know: as written
    ],
)
def test_windows_read_as_people_write_them(tool, requires, shown):
    assert tool.render_requires(requires) == shown


@pytest.mark.parametrize(
    "upstream, fixed_in, shown",
    [
        (
            "https://github.com/huggingface/trl/issues/3287 (fixed by PR #3290 in 0.17.0)",
            {"trl": "0.17.0"},
            "TRL 0.17.0 ([TRL issue #3287](https://github.com/huggingface/trl/issues/3287))",
        ),
        (
            "https://github.com/vllm-project/vllm/pull/28471 (fixed in vLLM 0.11.1; TRL shims it from 0.26.0)",
            {"vllm": "0.11.1", "trl": "0.26.0"},
            "vLLM 0.11.1; TRL 0.26.0 ([vllm PR #28471](https://github.com/vllm-project/vllm/pull/28471))",
        ),
        (
            "https://github.com/huggingface/trl/issues/3115 (never fixed in-process; server mode in 0.16.0)",
            {},
            "not fixed ([TRL issue #3115](https://github.com/huggingface/trl/issues/3115))",
        ),
        ("none for TRL 0.14-0.19; TRL 0.20's rewrite (PR #3072) no longer passes it", None, "none for TRL 0.14-0.19"),
        (
            "https://github.com/huggingface/trl/issues/2770 (name mismatch); more",
            None,
            "[TRL issue #2770](https://github.com/huggingface/trl/issues/2770)",
        ),
    ],
)
def test_upstream_is_shortened_to_the_fixing_release(tool, upstream, fixed_in, shown):
    assert tool.render_upstream(upstream, fixed_in) == shown


@pytest.mark.parametrize(
    "requires, shown",
    [
        ({"trl": ">=0.24.0.dev0", "vllm": ">=0.10.2.dev0"}, "not fixed upstream"),  # open: the newest release has it
        ({"trl": ">=0.24.0.dev0,<0.26.0a0"}, "not fixed"),  # closed: later releases dropped the code
    ],
)
def test_an_open_window_reads_not_fixed_upstream(tool, requires, shown):
    upstream = "https://github.com/huggingface/trl/issues/6789 (open)"
    link = " ([TRL issue #6789](https://github.com/huggingface/trl/issues/6789))"
    assert tool.render_upstream(upstream, {}, requires) == shown + link


def test_examples_show_the_release_readme_pins():
    """The log line and the report README (and docs/) show are those of the release a user installs from
    README's requirements line: at each release the numbers move with that line (CONTRIBUTING, release
    procedure, step 5)."""
    with open(README, encoding="utf-8") as handle:
        readme = handle.read()
    pinned = PINNED_RELEASE.findall(readme)
    assert len(pinned) == 1, pinned
    shown = {}
    for doc in [README, *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        with open(doc, encoding="utf-8") as handle:
            for block in FENCED.findall(handle.read()):
                for version in EXAMPLE_VERSION.findall(block):
                    shown.setdefault(version, set()).add(os.path.relpath(doc, ROOT))
    assert shown, "README's examples show no trl_compat version: EXAMPLE_VERSION no longer finds them"
    stale = {version: sorted(docs) for version, docs in shown.items() if version != pinned[0]}
    assert not stale, f"examples show trl_compat {stale}, README's requirements line release {pinned[0]}: change their numbers to it"
