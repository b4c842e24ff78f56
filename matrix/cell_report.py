"""Write this cell's ``python -m trl_compat --json`` report to a file (tox has no redirection)."""

import json
import os
import sys

from trl_compat.__main__ import collect

os.makedirs(os.path.dirname(os.path.abspath(sys.argv[1])), exist_ok=True)
with open(sys.argv[1], "w") as fh:
    json.dump(collect(), fh, indent=2)
