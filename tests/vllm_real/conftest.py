"""The one skip rule of the real-vLLM tests (instead of a prelude in each module).

A module here is collected only where a real vLLM engine can run it: torch and vLLM installed,
``real_vllm.skip_reason()`` None (a real vLLM, not the stand-in, on a device it can use), and what
the module's entry in :data:`NEEDS` names. Otherwise it is reported skipped with the reason, before
its code runs (its imports would fail). ``real_vllm`` is imported here first: it sets vLLM's
environment (V0 engine, CPU KV cache) before anything imports vLLM. What a module checks beyond
this (the TRL and vLLM releases it was written for) stays in the module.
"""

import importlib.util

import pytest

# module -> what it needs besides torch, vLLM and a usable engine:
#   "cpu"    a vLLM CPU build (the GRPO runs train on the CPU with vllm_device="cpu")
#   "grpo"   grpo_run's real-vLLM GRPO runs are supported by the installed TRL / vLLM
#   others   a distribution that must be installed
NEEDS = {
    "test_guard_real.py": ("cpu", "trl", "grpo"),
    "test_vllm_logprobs_real.py": ("cpu",),
    "test_vllm_prompts_real.py": ("cpu", "trl", "grpo"),
    "test_vllm_real.py": ("peft",),
    "test_vllm_real_grpo.py": ("cpu", "trl", "peft", "grpo"),
    "test_vllm_serve_real.py": ("cpu", "peft", "fastapi", "uvicorn", "requests"),
    "test_vllm_standin_vs_real.py": (),
}


def skip_reason(module_name):
    """Why the module ``module_name`` cannot run here (None: it can)."""
    if module_name not in NEEDS:
        raise pytest.UsageError(f"tests/vllm_real/{module_name}: give it an entry in NEEDS (tests/vllm_real/conftest.py)")
    for dist in ("torch", "vllm"):
        if importlib.util.find_spec(dist) is None:
            return f"needs {dist}"
    import real_vllm

    reason = real_vllm.skip_reason()
    if reason:
        return reason
    for need in NEEDS[module_name]:
        if need == "cpu":
            if real_vllm.DEVICE != "cpu":
                return "these runs train on the CPU with vllm_device='cpu' (a vLLM CPU build)"
        elif need == "grpo":
            import grpo_run

            reason = grpo_run.real_vllm_unsupported_reason()
            if reason:
                return reason
        elif importlib.util.find_spec(need) is None:
            return f"needs {need}"
    return None


class _Skipped(pytest.Module):
    reason = ""

    def collect(self):
        pytest.skip(self.reason)


def pytest_pycollect_makemodule(module_path, parent):
    reason = skip_reason(module_path.name)
    if reason is None:
        return None  # pytest's own Module
    module = _Skipped.from_parent(parent, path=module_path)
    module.reason = reason
    return module
