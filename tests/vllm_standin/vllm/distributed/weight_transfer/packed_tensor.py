"""Stand-in for ``vllm.distributed.weight_transfer.packed_tensor``: the packed broadcast's producer."""


def packed_nccl_broadcast_producer(iterator, group, src=0, post_iter_func=None, **kwargs):
    """Broadcasts every tensor of ``iterator`` (through ``post_iter_func`` when given) from ``src``;
    here: records ``(name, tensor)`` pairs in ``group.sent`` (one entry per call)."""
    if src != 0:
        raise ValueError(f"the trainer is rank 0 of the weight-transfer group, got src={src}")
    items = list(iterator)
    tensors = [post_iter_func(item) if post_iter_func is not None else item[1] for item in items]
    group.broadcast([(item[0], tensor) for item, tensor in zip(items, tensors)])
