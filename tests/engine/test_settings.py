"""Settings that answer back (trl_compat/_engine/settings.py): every TRL_COMPAT_* variable with a
value it does not accept warns once on stderr, naming the accepted values and what was assumed,
and ``python -m trl_compat`` shows it. Also the report's headline and the errors of the public API."""

import json
import os
import subprocess
import sys
import textwrap

import trl_compat
import trl_compat.__main__ as cli
from trl_compat._engine import settings
from trl_compat.patches import NEWEST_KNOWN_TRL, OLDEST_KNOWN_TRL, PATCHES

import pytest

from cells import engine_cells

ACCEPTED = "(on: 1, true, yes, on; off: 0, false, no, off or unset); assumed off"
KNOWN = [p.id for p in PATCHES]
OPT_IN = sorted({p.opt_in for p in PATCHES if p.opt_in})


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch):
    monkeypatch.setattr(settings, "_warned", set())


@pytest.mark.parametrize("variable", [settings.AUTO, settings.STRICT, settings.QUIET, *OPT_IN])
@pytest.mark.parametrize("value", ["maybe", "enabled", "2"])
def test_an_unrecognised_switch_value_warns_once_and_is_off(variable, value, monkeypatch, capsys):
    monkeypatch.setenv(variable, value)
    assert settings.switch(variable) is False
    assert settings.switch(variable) is False
    err = capsys.readouterr().err
    assert err == f"trl_compat: warning: {variable}={value!r} is not a recognised value {ACCEPTED}\n"


@pytest.mark.parametrize("value", ["1", " ON ", "Yes", "true", "0", "off", "No", "", "FALSE"])
def test_accepted_switch_values_say_nothing(value, monkeypatch, capsys):
    monkeypatch.setenv(settings.STRICT, value)
    assert settings.switch(settings.STRICT) is (value.strip().lower() in settings.ON)
    assert capsys.readouterr().err == ""
    assert settings.problems(KNOWN, OPT_IN)[settings.STRICT] == {"value": value, "problem": None}


def test_strict_reads_through_settings(monkeypatch, capsys):
    monkeypatch.setenv(settings.STRICT, "enabled")
    assert trl_compat.strict() is False
    assert "TRL_COMPAT_STRICT='enabled' is not a recognised value" in capsys.readouterr().err
    monkeypatch.setenv(settings.STRICT, "1")
    assert trl_compat.strict() is True


def test_unknown_disable_ids_warn_once(monkeypatch, capsys):
    monkeypatch.setenv(settings.DISABLE, "pad-token, no-such-patch,*")
    assert settings.disabled_ids(KNOWN) == {"pad-token", "no-such-patch", "*"}
    settings.disabled_ids(KNOWN)
    err = capsys.readouterr().err
    assert err == (
        "trl_compat: warning: TRL_COMPAT_DISABLE names unknown patch id 'no-such-patch' (accepted: a "
        "comma-separated list of patch ids, as `python -m trl_compat` lists them, or *); assumed: ignored\n"
    ), err


def test_a_mistyped_disable_id_gets_the_close_match_not_the_whole_list(monkeypatch, capsys):
    monkeypatch.setenv(settings.DISABLE, "pad_token,vllm-prefix-cach")
    settings.disabled_ids(KNOWN)
    err = capsys.readouterr().err
    assert "'pad_token' (did you mean pad-token?)" in err, err
    # the two closest, the closest first (cutoff 0.6)
    assert "'vllm-prefix-cach' (did you mean vllm-prefix-cache or vllm-server-reset-prefix-cache?)" in err, err
    others = [pid for pid in KNOWN if pid not in ("pad-token", "vllm-prefix-cache", "vllm-server-reset-prefix-cache")]
    assert not [pid for pid in others if pid in err], err  # the other ids are not listed


def test_problems_name_every_set_variable(monkeypatch):
    for name in list(os.environ):
        if name.startswith("TRL_COMPAT_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(settings.AUTO, "maybe")
    monkeypatch.setenv(settings.QUIET, "1")
    monkeypatch.setenv("TRL_COMPAT_NOT_A_SETTING", "x")  # not trl_compat's: not judged
    found = settings.problems(KNOWN, OPT_IN)
    assert found == {
        settings.AUTO: {"value": "maybe", "problem": f"TRL_COMPAT_AUTO='maybe' is not a recognised value {ACCEPTED}"},
        settings.QUIET: {"value": "1", "problem": None},
    }


def _report(env_extra, *args):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRL_COMPAT_") or k == "TRL_COMPAT_CELL"}
    env.update(env_extra, TRL_COMPAT_DISABLE="*")  # nothing pending: the report imports no trigger module
    return subprocess.run([sys.executable, "-m", "trl_compat", *args], env=env, capture_output=True, text=True, timeout=120)


@engine_cells
@pytest.mark.parametrize("variable,value", [(settings.AUTO, "maybe"), (settings.STRICT, "enabled"), (settings.QUIET, "sometimes")])
def test_the_report_shows_a_bad_value_and_the_process_warns_once(variable, value):
    out = _report({variable: value}, "--json")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    problem = f"{variable}={value!r} is not a recognised value {ACCEPTED}"
    assert data["settings"][variable] == {"value": value, "problem": problem}
    assert out.stderr.count(f"trl_compat: warning: {problem}\n") == 1, out.stderr
    text = _report({variable: value})
    assert f"  settings      {problem}" in text.stdout.splitlines(), text.stdout
    if variable == settings.AUTO:
        assert data["activation"]["summary"].startswith(f"not automatic: {problem}"), data["activation"]


SWITCH_BOOT = textwrap.dedent("""
    import site, sys
    site.addsitedir(sys.argv[1])  # processes trl_compat.pth, as site-packages' at start-up
    print("IMPORTED" if "trl_compat" in sys.modules else "NOT IMPORTED")
    import trl_compat  # its own check must not say it a second time
""")


def test_the_switchs_start_up_module_warns_about_a_bad_value(tmp_path):
    import shutil

    # the tree's copies: an installed wheel puts them at the site-packages root, not in the package
    site_files = os.path.join(os.path.dirname(__file__), "..", "..", "trl_compat", "activation", "site_files")
    for name in ("trl_compat.pth", "_trl_compat_auto.py"):
        shutil.copy(os.path.join(site_files, name), tmp_path / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRL_COMPAT_")}
    for value, imported, warnings in (("maybe", "NOT IMPORTED", 1), ("1", "IMPORTED", 0), ("off", "NOT IMPORTED", 0)):
        out = subprocess.run(
            [sys.executable, "-c", SWITCH_BOOT, str(tmp_path)],
            env=dict(env, TRL_COMPAT_AUTO=value),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0 and out.stdout.strip() == imported, (value, out)
        assert out.stderr.count("TRL_COMPAT_AUTO=") == warnings, (value, out.stderr)
        if warnings:
            assert out.stderr == f"trl_compat: warning: TRL_COMPAT_AUTO={value!r} is not a recognised value {ACCEPTED}\n"


# -- the headline ---------------------------------------------------------------------------------


def test_headline_inside_the_known_releases():
    trl = cli.trl_range("0.15.2", True)
    assert trl["where"] == "inside" and trl["note"] == ""
    assert cli.headline("9.9.9", trl) == (f"trl_compat 9.9.9 (knows trl {OLDEST_KNOWN_TRL} to {NEWEST_KNOWN_TRL}; installed: 0.15.2)")
    assert cli.trl_range(NEWEST_KNOWN_TRL, True)["where"] == "inside"
    assert cli.trl_range(OLDEST_KNOWN_TRL, True)["where"] == "inside"


@pytest.mark.parametrize(
    "version,has_grpo,where,says",
    [
        ("0.12.0", False, "older", "it has no GRPOTrainer (added in 0.14.0), so every patch says 'not needed'"),
        ("0.13.0", True, "older", "it has no GRPOTrainer"),
        ("0.16.0", False, "older", "it has no GRPOTrainer"),  # a build without the module
        ("1.17.0", True, "newer", f"is newer than the newest release trl_compat knows ({NEWEST_KNOWN_TRL})"),
        ("1.16.1.dev0", True, "newer", "is newer than the newest release"),
        (None, False, "not installed", "trl is not installed: no patch applies"),
    ],
)
def test_headline_outside_the_known_releases(version, has_grpo, where, says):
    trl = cli.trl_range(version, has_grpo)
    assert trl["where"] == where and says in trl["note"], trl
    assert cli.headline(trl_compat.__version__, trl) == f"trl_compat {trl_compat.__version__}: {trl['note']}"


@pytest.mark.parametrize("version", ["1.17.0", "0.12.0", None])
def test_report_headline_comes_first(monkeypatch, version):
    real = cli.dist_version
    monkeypatch.setattr(cli, "dist_version", lambda dist: version if dist == "trl" else real(dist))
    monkeypatch.setattr(cli, "_has_grpo_trainer", lambda: version not in ("0.12.0", None))
    monkeypatch.setattr(cli, "registry", lambda: [])  # import no trigger module into this test session
    data = cli.collect()
    assert list(data)[:2] == ["trl_compat", "headline"] and data["trl_compat"] == trl_compat.__version__
    assert data["headline"].startswith(f"trl_compat {trl_compat.__version__}: "), data["headline"]
    assert data["trl"]["where"] == {"1.17.0": "newer", "0.12.0": "older", None: "not installed"}[version]
    assert cli.render(data).splitlines()[0] == data["headline"]


# -- errors that name the problem -----------------------------------------------------------------


def test_an_unknown_id_names_the_close_match_and_the_public_class():
    with pytest.raises(KeyError) as raised:
        trl_compat.status("pad_token")
    assert str(raised.value) == (
        "unknown trl_compat patch id 'pad_token' (did you mean pad-token?); `python -m trl_compat` lists them all"
    )
    # a traceback names the class where users import it from, not a private module
    assert type(raised.value) is trl_compat.UnknownPatchId
    assert f"{type(raised.value).__module__}.{type(raised.value).__qualname__}" == "trl_compat.UnknownPatchId"
    assert f"{trl_compat.TrlCompatError.__module__}.TrlCompatError" == "trl_compat.TrlCompatError"
    for call in (trl_compat.install, trl_compat.revert):
        with pytest.raises(KeyError, match="unknown trl_compat patch ids 'nope'; 'nada'; `python -m trl_compat` lists"):
            call("nope", "nada")


@pytest.mark.parametrize("call", ["install", "revert"])
def test_a_list_of_ids_gets_a_type_error_saying_so(call):
    with pytest.raises(TypeError) as raised:
        getattr(trl_compat, call)(["pad-token"])
    assert str(raised.value) == (
        f"trl_compat.{call}() takes patch ids as separate string arguments, got list "
        f"['pad-token']; to pass a list, unpack it: trl_compat.{call}(*ids)"
    )
    with pytest.raises(TypeError, match=r"^trl_compat.status\(\) takes one patch id, a string; got list \['pad-token'\]$"):
        trl_compat.status(["pad-token"])


def test_help_is_plain_text():
    out = subprocess.run([sys.executable, "-m", "trl_compat", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "``" not in out.stdout and ":mod:" not in out.stdout, out.stdout
    assert "python -m trl_compat [--json]" in out.stdout and "trl-compat run -- CMD [ARGS...]" in out.stdout


# -- strict failures held back from TRL's lazy import ----------------------------------------------


def test_only_failures_a_hold_kept_back_are_raised_later_and_each_once(monkeypatch, fake_pkg, make_patch):
    """A trouble status left by a failure that was raised where it happened (or by a test's
    fault injection) must not make a later trainer raise: only what a hold kept back is."""
    from trl_compat._engine.patch import FAILED, TrlCompatError
    from trl_compat._engine.state import REGISTRY
    from trl_compat._helpers import training_log

    monkeypatch.setenv("TRL_COMPAT_STRICT", "1")
    patch = make_patch(fake_pkg)
    with pytest.raises(TrlCompatError):
        REGISTRY.set_status(patch, FAILED, "raised where it happened")
    assert training_log.held_failures() == []
    monkeypatch.setattr(settings, "_holds", [lambda: True])
    REGISTRY.set_status(patch, FAILED, "held")
    assert training_log.held_failures() == [f"{patch.id}: failed: held"]
    assert training_log.held_failures() == []
