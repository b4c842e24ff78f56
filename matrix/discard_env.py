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


def main(argv):
    env_dir, work_dir = (Path(p).resolve() for p in argv[1:3])
    if os.environ.get("TRL_COMPAT_KEEP_ENVS", "").strip() not in ("", "0"):
        print(f"kept {env_dir} (TRL_COMPAT_KEEP_ENVS is set)")
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
