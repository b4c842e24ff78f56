"""Stand-in for ``vllm.envs`` (vLLM 0.8.x): the variables that choose the engine, read from
``os.environ`` at each access, as vLLM reads them (lazily, at engine construction).

The defaults are vLLM >= 0.8.0's (V1 unless ``VLLM_USE_V1=0``). The stand-in installed as vLLM
0.7.x builds the V0 engine whatever they say (see ``vllm/engine/arg_utils.py``).
"""

import os

environment_variables = {
    "VLLM_USE_V1": lambda: bool(int(os.getenv("VLLM_USE_V1", "1"))),
    # the V1 engine core in a separate process; "external_launcher" turns it off
    "VLLM_ENABLE_V1_MULTIPROCESSING": lambda: bool(int(os.getenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1"))),
}


def __getattr__(name):
    if name in environment_variables:
        return environment_variables[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return list(environment_variables)


def is_set(name: str) -> bool:
    """Whether the user set ``name`` (as opposed to vLLM's default applying)."""
    if name not in environment_variables:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return name in os.environ


def set_vllm_use_v1(use_v1: bool) -> None:
    """vLLM records the engine it picked for the whole process when the user left the choice open."""
    if is_set("VLLM_USE_V1"):
        raise ValueError(
            "Should not call set_vllm_use_v1() if VLLM_USE_V1 is set explicitly by the user. "
            "Please raise this as a Github Issue and explicitly set VLLM_USE_V1=0 or 1."
        )
    os.environ["VLLM_USE_V1"] = "1" if use_v1 else "0"
