"""Stand-in for ``vllm.distributed``: import-only placeholders (TRL >= 0.16 imports them at module
import time when vLLM is installed). Constructing any of them raises ``NotImplementedError``."""
