"""The plan walked layer by layer (gathered under ZeRO-3) into vLLM's ``load_weights``, and the
fallback: upstream TRL 0.15.1's in-place merge, for structures the plan does not know."""

from __future__ import annotations

import warnings
from collections.abc import Generator, Iterator
from typing import Any

from trl_compat._helpers.vllm_sync.merge import Workspace, copy_merged_state, merged_weight, own_state
from trl_compat._helpers.vllm_sync.structure import Peft, Step, plan_steps, resolve
from trl_compat._helpers.zero3 import gathered


def _step_params(step: Step) -> list[Any]:
    if step.kind == "own":
        return [p for p in step.module._parameters.values() if p is not None]
    return list(step.module.parameters())


class Plan:
    """Steps in ``state_dict()`` order, plus who owns a merged weight that is also reachable
    under another name (tied embeddings)."""

    def __init__(self, model: Any) -> None:
        self.peft = Peft()
        self.root, self.peft_model = resolve(model, self.peft)
        self.steps = plan_steps(self.root, self.peft)
        self.merged_owner: dict[int, Step] = {}
        for step in self.steps:
            if step.kind in ("fast", "copy"):
                weight = step.module.get_base_layer()._parameters.get("weight")
                if weight is not None:
                    self.merged_owner[id(weight)] = step

    def _merged_from(self, owner: Step, workspace: Any) -> Any:
        if owner.kind == "fast":
            return merged_weight(owner.module, owner.adapters, type(owner.module) is self.peft.fast_embedding, workspace)
        return copy_merged_state(owner.module, "")["weight"]

    def items(self, step: Step, workspace: Any = None) -> dict[str, Any]:
        """What this step sends. Call inside ``gathered(self.params(step))``. Merged weights may
        live in ``workspace`` (a :class:`~trl_compat._helpers.vllm_sync.merge.Workspace`)."""
        if step.kind == "copy":
            return copy_merged_state(step.module, step.prefix)
        if step.kind == "fast":
            base = step.module.base_layer
            out = own_state(base, step.prefix)
            out[step.prefix + "weight"] = merged_weight(
                step.module, step.adapters, type(step.module) is self.peft.fast_embedding, workspace
            )
            return out
        out = own_state(step.module, step.prefix)
        for name, param in step.module._parameters.items():
            owner = self.merged_owner.get(id(param)) if param is not None else None
            if owner is not None and step.prefix + name in out:
                out[step.prefix + name] = self._merged_from(owner, workspace)
        return out

    def params(self, step: Step) -> list[Any]:
        params = _step_params(step)
        if step.kind == "own":
            for param in list(params):
                owner = self.merged_owner.get(id(param))
                if owner is not None:
                    params.extend(_step_params(owner))
        return params


def _stream(plan: Plan) -> Generator[tuple[str, Any], None, None]:
    workspace = Workspace()  # this sync's buffers, gone with the stream
    for step in plan.steps:
        with gathered(plan.params(step)):
            items = plan.items(step, workspace)
            while items:
                # pop so that nothing of ours keeps a merged tensor alive once it is sent
                name = next(iter(items))
                yield name, items.pop(name)
            del items


def iter_vllm_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, tensor)`` for ``model`` as a plain model of its base architecture
    would have them in ``state_dict()``, LoRA adapters merged; one layer at a time.

    ``model`` may be a PeftModel, a plain transformers model, or either wrapped by
    torch.compile / DDP / a DeepSpeed engine. A tensor may share storage with the
    model (never modify it) and, under ZeRO-3, is valid only until the next item is
    requested: consume each before asking for the next, as vLLM's ``load_weights`` does.
    Merged weights live in buffers the stream reuses once nothing else refers to them (the
    tensor or any view of it): a consumer that keeps items gets tensors of its own.
    Under ZeRO-3 every rank must run through the whole iterator (the gathers are collective).
    Raises :class:`UnsupportedModel` (before yielding anything) for structures it does not know.
    """
    plan = Plan(model)  # eager: structure errors surface before the first item
    return _stream(plan)


def _drain(plan: Plan) -> None:
    """Non-main ranks under ZeRO-3: take part in the same gathers, compute nothing."""
    for step in plan.steps:
        with gathered(plan.params(step)):
            pass


def push_to_vllm(model: Any, llm_model: Any, *, is_main: bool = True) -> None:
    """Load ``model``'s weights into a vLLM model (``...model_runner.model``) through its
    ``load_weights``. Call on every rank; only ``is_main`` sends (``llm_model`` may be None elsewhere)."""
    push(Plan(model), llm_model, is_main)


def push(plan: Plan, llm_model: Any, is_main: bool) -> None:
    if not is_main:
        _drain(plan)
        return
    stream = _stream(plan)
    try:
        llm_model.load_weights(stream)
        for _ in stream:  # a receiver that stops early must not leave other ranks in a gather
            pass
    finally:
        stream.close()


# -- fallback: upstream TRL 0.15.1's in-place merge, for structures we do not know --------


def push_inplace(peft_model: Any, llm_model: Any, is_main: bool) -> None:
    params = list(peft_model.parameters())
    prefix = getattr(peft_model.base_model, "prefix", "lora_")
    active = getattr(peft_model, "active_adapter", "default")
    with gathered(params):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            peft_model.merge_adapter()
        try:
            if is_main:
                state = peft_model.state_dict()
                items = (
                    (k.removeprefix("base_model.model.").replace(".base_layer", "").replace(f"modules_to_save.{active}.", ""), v)
                    for k, v in state.items()
                    if prefix not in k and "original_module" not in k
                )
                llm_model.load_weights(items)
        finally:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                peft_model.unmerge_adapter()
