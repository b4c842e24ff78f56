"""The check of one build: a TRL release's wheel from PyPI (``sweep_one``) or a main-branch commit built
from a clone of TRL's history (``sweep_commit``), swapped into its base venv, then ``CHECK`` in a fresh
interpreter: import trl_compat and TRL's GRPO modules, take ``trl_compat.report()``."""

import json
import os
import re
import subprocess
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.version import Version
from sweep_bases import base_python, choose_base, run
from sweep_commits import COMMITS, expected_at

FIRST = Version("0.14.0")

V = Version

CHECK = r"""
import json, traceback
out = {"crash": None, "imports": {}, "report": []}
try:
    import trl_compat
except Exception:
    out["crash"] = traceback.format_exc()
else:
    for name in ("trl.trainer.grpo_trainer", "trl.models.utils"):
        try:
            __import__(name)
            out["imports"][name] = "ok"
        except Exception as exc:
            tb = traceback.format_exc()
            out["imports"][name] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
            # trl_compat's fault only where it raised: its import hook is a frame of every import it
            # waits for, so a TRL import error passes through it
            if "trl_compat" in traceback.extract_tb(exc.__traceback__)[-1].filename:
                out["crash"] = tb
    try:
        out["report"] = [r.as_dict() for r in trl_compat.report()]
    except Exception:
        out["crash"] = traceback.format_exc()
import importlib.metadata as md
def ver(d):
    try: return md.version(d)
    except md.PackageNotFoundError: return None
out["versions"] = {d: ver(d) for d in ("trl", "transformers", "deepspeed", "peft", "accelerate", "vllm", "requests")}
print("SWEEP-JSON " + json.dumps(out))
"""


def trl_releases():
    out = run([sys.executable, "-m", "pip", "index", "versions", "trl"]).stdout
    listed = re.search(r"Available versions: (.*)", out).group(1).split(", ")
    return sorted(V(v) for v in listed if not V(v).is_prerelease and V(v) >= FIRST)


def wheel_requirements(wheel):
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    reqs = [Requirement(line.split(":", 1)[1].strip()) for line in text.splitlines() if line.startswith("Requires-Dist:")]
    return [r for r in reqs if not r.marker or r.marker.evaluate({"extra": ""})]


def sweep_one(work, version):
    wheels = work / "wheels"
    wheels.mkdir(exist_ok=True)
    found = list(wheels.glob(f"trl-{version}-*.whl"))
    if not found:
        run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--only-binary",
                ":all:",
                "-d",
                str(wheels),
                f"trl=={version}",
            ]
        )
        found = list(wheels.glob(f"trl-{version}-*.whl"))
    reqs = wheel_requirements(found[0])
    base = choose_base(work, version, reqs)
    python = base_python(work, base)
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(found[0])])
    return check(python, str(version), base)


def check(python, version, base):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRL_COMPAT_")}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([str(python), "-c", CHECK], text=True, capture_output=True, env=env, timeout=600)
    line = next((out for out in proc.stdout.splitlines() if out.startswith("SWEEP-JSON ")), None)
    if line is None:
        return {
            "version": version,
            "base": base,
            "crash": f"checker died (rc {proc.returncode}): {proc.stderr[-800:]}",
            "imports": {},
            "report": [],
            "versions": {},
        }
    data = json.loads(line[len("SWEEP-JSON ") :])
    data.update(version=version, base=base)
    return data


def source_version(src):
    """The version a TRL source tree builds: its VERSION file (from 0.23), else the literal
    ``__version__`` of trl/__init__.py (before; later trees read it from the installed metadata)."""
    if (src / "VERSION").exists():
        return V((src / "VERSION").read_text().strip())
    return V(re.search(r'__version__ = "([^"]+)"', (src / "trl" / "__init__.py").read_text()).group(1))


def sweep_commit(work, git, commit):
    """Build ``commit`` of TRL from the clone at ``git`` and check it like a release."""
    src = work / "src" / commit
    if not (src / "setup.py").exists() and not (src / "pyproject.toml").exists():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "--git-dir", git, "archive", "--format=tar", commit], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    dev = source_version(src)
    python = base_python(work, choose_base(work, dev, []))
    run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(src)])
    row = check(python, f"{dev}@{commit}", choose_base(work, dev, []))
    # kept with the row: --no-run judges it again without the clone
    row["expect"] = next(e for c, _, e in COMMITS if c == commit) or expected_at(git, commit)
    return row
