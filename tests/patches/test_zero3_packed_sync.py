"""No patch: the finding that settles a lead about TRL >= 1.11's server-mode weight sync under ZeRO-3.

The lead (raised in review of TRL PR #6765, "Use vLLM's own server instead of TRL's"): for a non-PEFT
ZeRO-3 model ``VLLMGeneration._iter_named_params`` yields ``param.data`` inside
``GatheredParameters([param])`` and leaves that gather at the next ``next()``, while vLLM's packed
producer (``packed_broadcast_producer``, ``trainer_send_weights(packed=True)``) keeps views of the
yielded tensors until its bucket is full: would vLLM be sent released (empty or reused) storage?

The finding: no. DeepSpeed releases a gathered parameter by rebinding ``param.data`` to an empty
tensor (``free_param``); the tensor TRL yielded, and every view of it, still owns the gathered
storage, which nothing overwrites or frees while a view is alive. The buffered bytes equal the whole
model gathered at once (tests/support/zero3_packed_sync_worker.py: TRL's real ``_iter_named_params``,
2 gloo processes, every parameter partitioned; buckets of 4 KiB, so that small tensors wait in a
bucket across several releases, and vLLM's default 1 GiB). A control whose release overwrites the
gathered storage in place shows that the comparison catches stale views.

Found instead (PEFT, not fixed here): the PEFT walk yields the merged weights inside one whole-model
gather and runs ``model.unmerge_adapter()`` (in place) when the consumer asks for the next item after
the last; vLLM's ``pack_tensors`` only ``torch.cat``s its last chunk after that ``StopIteration``. With
vLLM's default 1 GiB bucket a model under 1 GiB is one chunk: every LoRA-targeted weight reaches vLLM
unmerged (all 14 of the tiny Qwen2 here); a larger model loses the merge in its last chunk. Silent:
server-mode generation samples from (partly) the base model. Runs where TRL >= 1.11, DeepSpeed and
peft are installed.
"""

import importlib.util

import pytest
from packaging.version import Version

pytest.importorskip("torch")

from grpo_run import LORA_TARGETS
from versions import installed
from workers import launch_two

TRL, DS, PEFT = installed("trl"), installed("deepspeed"), installed("peft")
needs_packed_sync = pytest.mark.skipif(
    TRL is None or TRL < Version("1.11.0") or DS is None or PEFT is None or importlib.util.find_spec("deepspeed") is None,
    reason=f"TRL >= 1.11's VLLMGeneration with DeepSpeed and peft (here trl {TRL}, deepspeed {DS}, peft {PEFT})",
)


@needs_packed_sync
def test_packed_sync_under_zero3():
    run = launch_two("zero3_packed_sync_worker.py", marker="Z3|")
    assert run.returncode == 0, run.tail()
    for variant in ("plain", "plain-default-bucket", "peft"):
        for packed in run.per_rank("packed", variant=variant):
            assert packed["names"] == packed["expected_names"] > 0, packed
            # the lead answered: views buffered past the release of their gather still read the gathered values
            assert packed["differing"] == [], packed
            assert packed["released"] == [0], packed  # every parameter was released again after its gather
    for control in run.per_rank("packed", variant="control"):
        # a release that overwrote the storage would be seen (the small tensors that wait in a bucket across next())
        assert control["differing"] and control["differing_in_last_chunk"] > 0, control
    for packed in run.per_rank("packed", variant="peft-default-bucket"):
        # the bug found instead: one chunk, packed after the PEFT walk ran model.unmerge_adapter() in place, so
        # every LoRA-targeted weight reaches vLLM unmerged (14 in this tiny Qwen2)
        assert packed["chunks"] == 1 and len(packed["differing"]) == 14, packed
        assert all(name.rsplit(".", 2)[-2] in LORA_TARGETS for name in packed["differing"]), packed
