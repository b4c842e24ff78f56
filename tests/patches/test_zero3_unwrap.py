"""zero3-unwrap and zero3-hooks-api, with real DeepSpeed ZeRO-3 on the CPU and 2 processes.

Each 2-process test launches ``tests/support/zero3_worker.py`` under ``torch.distributed.run``
(real GRPO steps on a tiny Qwen2, ZeRO-3 with every parameter partitioned, gloo) and
asserts on its exit status and its ``Z3|{json}`` markers. One launch with the
patches (strict mode), one with ``TRL_COMPAT_DISABLE`` naming both, where they apply.
About 20-30 s per launch on 2 cores; skipped where deepspeed or trl is missing.
"""

import importlib.metadata
import importlib.util

import trl_compat
from trl_compat import _engine

import pytest
from packaging.version import Version

from versions import installed
from workers import launch_two

UNWRAP, HOOKS_API = "zero3-unwrap", "zero3-hooks-api"
NO_OPTIMIZER = "AttributeError: 'Qwen2ForCausalLM' object has no attribute 'optimizer'"
RENAMED = "AttributeError: 'DeepSpeedZeRoOffload' object has no attribute '_register_hooks_recursively'"


TRL, DS = installed("trl"), installed("deepspeed")
HAVE_BOTH = TRL is not None and DS is not None and importlib.util.find_spec("deepspeed") is not None
# The tests derive expectations from versions; the patches themselves probe the code.
TRL_014 = TRL is not None and TRL < Version("0.15.0")
TRL_AFFECTED = TRL is not None and Version("0.14.0") <= TRL < Version("0.16.0")
DS_RENAMED = DS is not None and DS >= Version("0.16.4")

needs_deepspeed = pytest.mark.skipif(not HAVE_BOTH, reason="needs trl and deepspeed")
# The worker drives GRPO the way TRL 0.14-0.16 do (GRPOConfig fields, generation path);
# newer TRL is outside both patches' windows, which test_status checks in-process.
worker_knows_trl = pytest.mark.skipif(
    TRL is None or TRL >= Version("0.17.0"), reason="the 2-process worker covers TRL 0.14-0.16 (patch windows + fixed 0.16)"
)


def expected_statuses():
    return {
        UNWRAP: trl_compat.APPLIED if HAVE_BOTH and TRL_AFFECTED else trl_compat.NOT_NEEDED,
        HOOKS_API: trl_compat.APPLIED if HAVE_BOTH and TRL_AFFECTED and DS_RENAMED else trl_compat.NOT_NEEDED,
    }


# -- in-process: statuses and bindings (cheap, every cell) ------------------------------------


@pytest.mark.skipif(not (HAVE_BOTH and TRL_AFFECTED), reason="zero3-unwrap applies only to trl < 0.16 with deepspeed")
def test_every_trl_binding_of_unwrap_is_the_wrapper():
    import trl.models
    import trl.models.utils as utils
    import trl.trainer.grpo_trainer as grpo

    wrapper = utils.unwrap_model_for_generation
    assert UNWRAP in _engine.markers(wrapper)
    assert grpo.unwrap_model_for_generation is wrapper  # what GRPOTrainer calls
    assert trl.models.unwrap_model_for_generation is wrapper
    # remove_hooks is TRL's own; add_hooks belongs to zero3-hooks-api and zero3-hooks-trace where they apply.
    assert not hasattr(utils.remove_hooks, "__trl_compat_patch__")
    assert _engine.markers(utils.add_hooks) <= {HOOKS_API, "zero3-hooks-trace"}


# -- 2 processes, real ZeRO-3 ------------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import tiny

    return tiny.save_tiny(tmp_path_factory.mktemp("zero3") / "tiny_qwen2", "qwen2")


def launch(model_dir, out_dir, disable=""):
    return launch_two("zero3_worker.py", model_dir, out_dir, marker="Z3|", disable=disable)


def check_common(run):
    """What holds with or without the patches: engine, sharding, reference generation."""
    engines = run.per_rank("engine")
    baseline = engines[0]["hooks"]
    for engine in engines:
        assert engine["engine"] == "DeepSpeedEngine" and engine["wraps_bare"], engine
        assert engine["bare_has_optimizer"] is False  # Trainer.model is the bare module
        assert engine["hooks"] == baseline > 0
    shards = run.per_rank("shard", when="begin")
    for shard in shards:
        # Really sharded: no rank holds a whole parameter, each holds about half of all.
        assert shard["local_numel"] == 0 and shard["all_partitioned"], shard
        assert 0 < shard["shard_numel"] < shard["full_numel"] <= 2 * shard["shard_numel"], shard
    for loaded in run.per_rank("loaded"):
        assert loaded["mismatched"] == [], loaded  # ZeRO-3 loaded the checkpoint intact
    reference = run.per_rank("unwrap", label="reference")  # gather off: DeepSpeed's hooks fetch per submodule
    for ref in reference:
        assert ref["error"] is None and ref["hooks_inside"] == baseline and ref["fetches"] > 0, ref
    assert reference[0]["tokens"] == reference[1]["tokens"]
    return baseline, reference[0]["tokens"]


def assert_hooks_off_while_generating(event, baseline, tokens):
    """Generation ran on gathered weights with the ZeRO-3 hooks removed, and they came back."""
    assert event["error"] is None, event
    assert event["hooks_inside"] == 0, event
    assert event["fetches"] == 0 and event["allgathers"] == 0, event  # no per-token fetch or re-gather
    assert event["tokens"] == tokens, event
    assert event["hooks_after"] == baseline, event


def check_training(run, baseline, hooks_during):
    gens = run.of("grpo_generate")
    assert {g["rank"] for g in gens} == {0, 1} and len(gens) >= 4, run.tail()  # 2 steps x 2 ranks
    for gen in gens:
        assert gen["hooks_during"] == hooks_during, gen
        assert (gen["fetches"] == 0) is (hooks_during == 0), gen
    for step in run.of("step"):
        assert step["hooks"] == baseline, step
    for train in run.per_rank("train"):
        assert train["steps"] == 2 and len(train["losses"]) == 2 and train["finite"], train
        assert train["weights_moved"] > 0, train  # real optimizer steps on this rank's shard
        assert train["hooks"] == baseline, train
    for shard in run.per_rank("shard", when="end"):
        assert shard["local_numel"] == 0 and shard["all_partitioned"], shard
    run.per_rank("done")


@needs_deepspeed
@worker_knows_trl
def test_grpo_zero3_two_processes_with_patches(model_dir, tmp_path):
    run = launch(model_dir, tmp_path / "out")
    assert run.returncode == 0, run.tail()
    for versions in run.per_rank("versions"):
        assert versions["statuses"] == expected_statuses(), versions
    baseline, tokens = check_common(run)

    if TRL_AFFECTED:
        for label in ("bare", "engine"):
            for event in run.per_rank("unwrap", label=label):
                assert_hooks_off_while_generating(event, baseline, tokens)
        for event in run.per_rank("unwrap", label="raise"):
            assert event["error"].startswith("Boom") and event["hooks_inside"] == 0, event
            assert event["hooks_after"] == baseline, event  # put back although the block raised
        if DS_RENAMED:
            # With zero3-hooks-api reverted, zero3-unwrap does not hand TRL the engine (TRL
            # could not put the hooks back): TRL 0.15's behaviour (gathered, hooks left on),
            # on 0.14.0 too, whose own code would raise AttributeError ... 'optimizer'.
            for event in run.per_rank("unwrap", label="bare_without_hooks_api"):
                assert event["error"] is None and event["hooks_inside"] == baseline, event
                assert event["tokens"] == tokens and event["hooks_after"] == baseline, event
            run.per_rank("reinstalled", status=trl_compat.APPLIED)
        assert not run.of("repaired"), run.of("repaired")
    else:
        # Fixed release, nothing applied: TRL's own behaviour. GRPO unwraps the engine;
        # a bare-module unwrap keeps the hooks (early return) and an error inside the
        # block still leaves the engine without hooks (no finally in TRL 0.16 either).
        for event in run.per_rank("unwrap", label="engine"):
            assert_hooks_off_while_generating(event, baseline, tokens)
        for event in run.per_rank("unwrap", label="bare"):
            assert event["error"] is None and event["hooks_inside"] == baseline, event
        for event in run.per_rank("unwrap", label="raise"):
            assert event["hooks_after"] == 0, event
    check_training(run, baseline, hooks_during=0)


@needs_deepspeed
@pytest.mark.skipif(not TRL_AFFECTED, reason="both patches are not needed from trl 0.16.0 on")
def test_grpo_zero3_two_processes_without_patches(model_dir, tmp_path):
    run = launch(model_dir, tmp_path / "out", disable=f"{UNWRAP},{HOOKS_API}")
    for versions in run.per_rank("versions"):
        assert versions["statuses"] == {UNWRAP: trl_compat.DISABLED, HOOKS_API: trl_compat.DISABLED}
    baseline, tokens = check_common(run)

    bare = run.per_rank("unwrap", label="bare")
    if TRL_014:
        for event in bare:  # remove_hooks reads model.optimizer on the bare module
            assert event["error"] == NO_OPTIMIZER and event["hooks_after"] == baseline, event
    else:
        for event in bare:  # 0.15's early return: hooks left on, fetched and re-gathered per token
            assert event["error"] is None and event["tokens"] == tokens, event
            assert event["hooks_inside"] == baseline and event["fetches"] > 0 and event["allgathers"] > 0, event

    for event in run.per_rank("unwrap", label="engine"):
        if DS_RENAMED:  # add_hooks fails after remove_hooks: the engine is left without hooks
            assert event["error"] == RENAMED and event["hooks_inside"] == 0 and event["hooks_after"] == 0, event
        else:
            assert_hooks_off_while_generating(event, baseline, tokens)
    for event in run.per_rank("unwrap", label="raise"):
        assert event["error"].startswith("Boom") and event["hooks_after"] == 0, event  # not put back

    if TRL_014 and DS_RENAMED:
        # TRL 0.14.0 unwraps the engine at every GRPO step: the first step dies.
        assert run.returncode != 0, run.tail()
        assert RENAMED in run.rest and "trl/models/utils.py" in run.rest, run.tail()  # TRL's traceback
        assert not run.of("train"), run.tail()
    else:
        assert run.returncode == 0, run.tail()
        # 0.14.0 unwraps the engine (hooks off); 0.15.x the bare module (hooks stay on).
        check_training(run, baseline, hooks_during=0 if TRL_014 else baseline)
