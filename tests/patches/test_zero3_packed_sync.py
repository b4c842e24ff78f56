"""No patch: the finding that settles a lead about TRL >= 1.11's server-mode weight sync under ZeRO-3.

The lead (raised in review of TRL PR #6765, "Use vLLM's own server instead of TRL's"): for a non-PEFT
ZeRO-3 model ``VLLMGeneration._iter_named_params`` yields ``param.data`` inside
``GatheredParameters([param])`` and leaves that gather at the next ``next()``, while vLLM's packed
producer (``packed_broadcast_producer``, ``trainer_send_weights(packed=True)``) keeps views of the
yielded tensors until its bucket is full: would vLLM be sent released (empty or reused) storage?

The finding: no. DeepSpeed releases a gathered parameter by rebinding ``param.data`` to an empty
tensor (``free_param``); the tensor TRL yielded, and every view of it, still owns the gathered
storage, which nothing overwrites or frees while a view is alive. The buffered bytes equal the whole
model gathered at once, for the plain and the PEFT walk (tests/support/zero3_packed_sync_worker.py:
2 gloo processes, every parameter partitioned, buckets of 4 KiB so that each spans several released
parameters). The cost is memory, not correctness: a bucket keeps its parameters' gathered storage
alive until it is sent. A control whose release overwrites the gathered storage in place shows that
the comparison would catch stale views. Runs where TRL >= 1.11 and DeepSpeed are installed.
"""

import importlib.util

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

TRL, DS, PEFT = installed("trl"), installed("deepspeed"), installed("peft")
needs_packed_sync = pytest.mark.skipif(
    TRL is None or TRL < Version("1.11.0") or DS is None or PEFT is None or importlib.util.find_spec("deepspeed") is None,
    reason=f"TRL >= 1.11's VLLMGeneration with DeepSpeed and peft (here trl {TRL}, deepspeed {DS}, peft {PEFT})",
)


@needs_packed_sync
def test_packed_views_outlive_the_zero3_release():
    run = launch_two("zero3_packed_sync_worker.py", marker="Z3|")
    assert run.returncode == 0, run.tail()
    for variant in ("plain", "peft"):
        for packed in run.per_rank("packed", variant=variant):
            assert packed["bytes"] == packed["expected_bytes"] > 0, packed
            assert packed["equal"] is True, packed  # the buffered views read the gathered values
            assert packed["released"] == [0], packed  # every parameter was released again after its gather
    for control in run.per_rank("packed", variant="control"):
        # a release that overwrote the storage would be seen: same size, other bytes
        assert control["bytes"] == control["expected_bytes"] and control["equal"] is False, control
