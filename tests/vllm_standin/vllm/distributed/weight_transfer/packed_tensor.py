"""Stand-in for ``vllm.distributed.weight_transfer.packed_tensor``: the packed broadcast's producer."""

DEFAULT_PACKED_BUFFER_SIZE_BYTES = 1024**3  # vLLM's defaults; producer and consumer must agree
DEFAULT_PACKED_NUM_BUFFERS = 2


def packed_nccl_broadcast_producer(
    iterator, group, src, post_iter_func, buffer_size_bytes=DEFAULT_PACKED_BUFFER_SIZE_BYTES, num_buffers=DEFAULT_PACKED_NUM_BUFFERS
):
    """Broadcasts every tensor of ``iterator`` (through ``post_iter_func``, required as in vLLM) from
    ``src``; here: records ``(name, tensor)`` pairs in ``group.sent`` (one entry per call)."""
    if src != 0:
        raise ValueError(f"the trainer is rank 0 of the weight-transfer group, got src={src}")
    items = list(iterator)
    group.broadcast([(item[0], post_iter_func(item)) for item in items])
