"""Test-only recorder inside a ``trl vllm-serve`` process (tests/vllm_real/test_vllm_serve_real.py).

Put on ``PYTHONPATH`` behind ``trl-compat run``'s bootstrap, which runs it first (it chains to the
``sitecustomize`` it shadows). With ``TRL_COMPAT_TEST_SERVE_LOG=<file>`` set, every process of the
server appends one JSON line per event to that file (append mode: the server's main process and its
forked engine process share it):

* ``engine``: a ``vllm.LLM`` was built: the ``vllm`` module's file and version, whether vLLM's
  platform is the CPU and whether it is this repo's stand-in, the engine's model, dtype,
  max_model_len and enforce_eager, the pid, and how trl_compat got into
  this process with the statuses of its patches (the bootstrap imports it after this file runs);
* ``generate``: one ``LLM.generate`` call: per ``RequestOutput``, the ``prompt_token_ids`` the
  engine ran and the completions' ``token_ids``;
* ``grpo_trainer``: a ``GRPOTrainer`` is being built in the server process (none ever should: the
  prompt patches change only its methods, so they cannot act in a server);
* ``reset_prefix_cache``: one ``LLMEngine.reset_prefix_cache`` call (TRL 0.16's server calls the
  engine's, 0.17+'s ``LLM.reset_prefix_cache``, which calls it) and what it returned.

One CPU adaptation, for TRL 0.16.x only, recorded as ``cpu_worker_base``: its server passes vLLM
``worker_cls=WeightSyncWorker``, a subclass of vLLM's CUDA ``Worker`` (0.17+ inject a worker
*extension* into whatever worker the platform uses), which cannot run on the CPU
(``'ModelInputForGPUBuilder' object has no attribute 'chunked_prefill'``). The class is rebased onto
vLLM's ``CPUWorker``; its own methods (the NCCL weight sync, which the tests never call) are kept.

Also, as tests/support/real_vllm.py does in process: vLLM 0.8.5 inspects each model class in a
fresh Python process (~15 s per engine here); it is done in process instead.

Plain code with no import of trl_compat, so that what it records does not depend on the code under test.
"""

import json
import os
import sys

_LOG = os.environ.get("TRL_COMPAT_TEST_SERVE_LOG")


def _write(event, **fields):
    fields.update(event=event, pid=os.getpid())
    with open(_LOG, "a") as out:
        out.write(json.dumps(fields) + "\n")


def _trl_compat():
    if "trl_compat" not in sys.modules:
        return None
    import trl_compat
    import trl_compat.activation

    return {"how": trl_compat.activation.this_process(), "statuses": {p.id: p.status for p in trl_compat.report()}}


def _on_llm_module(module):
    cls, engine = module.LLM, sys.modules["vllm.engine.llm_engine"].LLMEngine
    init, generate, reset = cls.__init__, cls.generate, engine.reset_prefix_cache

    def recording_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        import vllm
        from vllm.platforms import current_platform

        _write(
            "engine",
            vllm_file=vllm.__file__,
            vllm_version=vllm.__version__,
            stand_in=bool(getattr(vllm, "__stand_in__", False)),
            cpu=current_platform.is_cpu(),
            config={k: getattr(self.llm_engine.model_config, k) for k in ("max_model_len", "enforce_eager", "model")}
            | {"dtype": str(self.llm_engine.model_config.dtype)},
            trl_compat=_trl_compat(),
        )

    def recording_generate(self, *args, **kwargs):
        outputs = generate(self, *args, **kwargs)
        requests = [{"prompt": list(o.prompt_token_ids), "completions": [list(c.token_ids) for c in o.outputs]} for o in outputs]
        _write("generate", requests=requests)
        return outputs

    def recording_reset(self, *args, **kwargs):
        result = reset(self, *args, **kwargs)
        _write("reset_prefix_cache", result=result if isinstance(result, (bool, type(None))) else repr(result))
        return result

    cls.__init__, cls.generate, engine.reset_prefix_cache = recording_init, recording_generate, recording_reset


def _on_vllm_serve(module):
    worker = getattr(module, "WeightSyncWorker", None)
    if worker is None:
        return
    from vllm.platforms import current_platform
    from vllm.worker.worker import Worker

    if current_platform.is_cpu() and worker.__bases__ == (Worker,):
        from vllm.worker.cpu_worker import CPUWorker

        worker.__bases__ = (CPUWorker,)
        _write("cpu_worker_base", worker=f"{worker.__module__}.{worker.__qualname__}")


def _on_grpo_module(module):
    # __new__, not __init__: trl_compat's probes read the source of GRPOTrainer.__init__ (TRL's
    # classes inherit object.__new__, which must not be given the arguments)
    def recording_new(cls, *args, **kwargs):
        _write("grpo_trainer")
        return object.__new__(cls)

    module.GRPOTrainer.__new__ = recording_new


def _on_registry(module):
    if hasattr(module, "_run_in_subprocess"):
        module._run_in_subprocess = lambda fn: fn()


_HOOKS = {"vllm.entrypoints.llm": _on_llm_module, "trl.scripts.vllm_serve": _on_vllm_serve}
_HOOKS["vllm.model_executor.models.registry"] = _on_registry
_HOOKS["trl.trainer.grpo_trainer"] = _on_grpo_module


class _Loader:
    def __init__(self, loader, hook):
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.hook(module)


class _Finder:
    """Wraps the loader of a watched module so that its hook runs once the module's code has run."""

    searching = set()  # names being looked up through the other finders (which may ask this one back)

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in _HOOKS or fullname in self.searching:
            return None
        self.searching.add(fullname)
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _Loader(spec.loader, _HOOKS[fullname])
                    return spec
        finally:
            self.searching.discard(fullname)
        return None


if _LOG:
    sys.meta_path.insert(0, _Finder())
