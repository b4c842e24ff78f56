"""Stand-in for ``vllm.utils`` (only what TRL imports).

``get_open_port`` is exported here up to vLLM 0.13 (0.11.1 - 0.13 moved it to
``vllm.utils.network_utils`` and kept this name with a deprecation warning); from 0.14.0 only
``vllm.utils.network_utils`` has it (the table in TRL PR #4883), so TRL 0.17 - 0.27's
``from vllm.utils import get_open_port`` fails as it does on vLLM 0.14.
"""

from ..sampling_params import _installed_version

if _installed_version() < (0, 14):
    from .network_utils import get_open_port  # noqa: F401
