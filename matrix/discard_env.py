"""Delete a matrix cell's virtualenv once its tests have run.

Each cell's venv holds its own torch, transformers, pyarrow, ... (about 1.5 GB);
thirteen of them kept side by side need about 20 GB, and a CI run once died in
the last cell's `pip install` when the disk ran short. Its results already sit
in `.tox/matrix-results/`, so the venv is only worth keeping while iterating on
one cell: set TRL_COMPAT_KEEP_ENVS=1 for that.

usage: python matrix/discard_env.py ENV_DIR TOX_WORK_DIR
"""

import os
import shutil
import sys
from pathlib import Path

# The values every TRL_COMPAT_* switch accepts (trl_compat/_engine/settings.py); this script runs
# where trl_compat may not be importable (a cell whose install failed), so they are repeated here
# and tests/test_fixtures.py holds the two equal.
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off", "")


def keep_envs(raw):
    """TRL_COMPAT_KEEP_ENVS as a switch: `false` means off, like every other one. A value that is
    neither keeps the venv (deleting is the step that cannot be undone) and says so."""
    value = raw.strip().lower()
    if value in OFF:
        return False
    if value not in ON:
        print(
            f"TRL_COMPAT_KEEP_ENVS={raw!r} is not a recognised value (on: {', '.join(ON)}; off: {', '.join(OFF[:-1])} or unset); kept",
            file=sys.stderr,
        )
    return True


def main(argv):
    env_dir, work_dir = (Path(p).resolve() for p in argv[1:3])
    if keep_envs(os.environ.get("TRL_COMPAT_KEEP_ENVS", "")):
        print(f"kept {env_dir} (TRL_COMPAT_KEEP_ENVS is on)")
        return 0
    # Only ever a venv directly under tox's work dir: a wrong argument must not
    # be able to delete anything else.
    if env_dir.parent != work_dir or not (env_dir / "pyvenv.cfg").is_file():
        print(f"not deleting {env_dir}: not a venv directly under {work_dir}", file=sys.stderr)
        return 1
    shutil.rmtree(env_dir, ignore_errors=True)
    print(f"deleted {env_dir} to free disk (TRL_COMPAT_KEEP_ENVS=1 keeps it)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
