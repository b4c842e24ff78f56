"""A patch's declared ``changes``: the Patcher refuses any other attribute (and the lifecycle
rolls the patch back), patches stack by the overlap of their declarations, and the report names
them before the trigger module is imported. Synthetic patches on a synthetic package."""

import importlib
import logging

import trl_compat
from trl_compat import _engine as engine
from trl_compat import testing
from trl_compat.patches import GRPO_MODULE, PATCHES

import pytest


def _tagging(tag, applied=None, name="step"):
    """An apply that wraps ``Trainer.<name>``, adding ``tag`` to the result (and counting applies)."""

    def apply(module, patcher):
        if applied is not None:
            applied.append(tag)

        def factory(inner):
            def wrapper(self, *args, **kwargs):
                return (tag,) + inner(self, *args, **kwargs)

            return wrapper

        patcher.wrap(module.Trainer, name, factory)

    return apply


# -- the Patcher ------------------------------------------------------------------


def test_wrap_and_replace_refuse_an_undeclared_attribute(fake_pkg):
    mod = importlib.import_module(fake_pkg)
    before = dict(vars(mod.Trainer))
    patcher = engine.Patcher("test-declared", changes=[f"{fake_pkg}:Trainer.step"])
    with pytest.raises(engine.UndeclaredChange, match=r"test-declared may not change .*Trainer\.other.*Trainer\.step"):
        patcher.wrap(mod.Trainer, "other", lambda original: original)
    with pytest.raises(engine.UndeclaredChange):
        patcher.replace(mod.Trainer, "other", lambda self: "no")
    assert dict(vars(mod.Trainer)) == before
    patcher.wrap(mod.Trainer, "step", lambda original: lambda self, x: ("declared",) + original(self, x))
    assert mod.Trainer().step(1) == ("declared", "base", 1)
    patcher.undo()
    assert dict(vars(mod.Trainer)) == before


def test_owners_match_by_identity_not_by_name(fake_pkg):
    mod = importlib.import_module(fake_pkg)
    patcher = engine.Patcher("test-declared", changes=[f"{fake_pkg}:Trainer.step"])
    subclass = type("Trainer", (mod.Trainer,), {"__module__": mod.__name__, "__qualname__": "Trainer"})
    with pytest.raises(engine.UndeclaredChange):
        patcher.replace(subclass, "step", lambda self, x: x)
    with pytest.raises(engine.UndeclaredChange):  # the base that defines it is another owner
        patcher.replace(mod.Base, "step", lambda self, x: x)
    assert "step" not in vars(subclass) and vars(mod.Base)["step"](None, 2) == ("base", 2)


def test_a_declared_name_that_does_not_resolve_is_not_available(fake_pkg):
    mod = importlib.import_module(fake_pkg)
    patcher = engine.Patcher("test-declared", changes=[f"{fake_pkg}:Renamed.step", "not_imported_module:X.y"])
    with pytest.raises(engine.UndeclaredChange):
        patcher.replace(mod.Trainer, "step", lambda self, x: x)


def test_a_declared_attribute_the_release_lacks_may_be_added(fake_pkg):
    mod = importlib.import_module(fake_pkg)
    patcher = engine.Patcher("test-declared", changes=[f"{fake_pkg}:MISSING_GLOBAL"])
    patcher.replace(mod, "MISSING_GLOBAL", 42)
    assert mod.MISSING_GLOBAL == 42
    patcher.undo()
    assert not hasattr(mod, "MISSING_GLOBAL")


def test_a_declared_module_imported_by_the_apply_itself_is_resolved_then(fake_pkg):
    patcher = engine.Patcher("test-declared", changes=[f"{fake_pkg}:Trainer.step"])  # not imported yet
    mod = importlib.import_module(fake_pkg)
    patcher.wrap(mod.Trainer, "step", lambda original: original)
    patcher.undo()


# -- the lifecycle ----------------------------------------------------------------


def test_an_undeclared_change_fails_the_patch_and_rolls_it_back(fake_pkg, make_patch, caplog):
    mod = importlib.import_module(fake_pkg)
    before = dict(vars(mod.Trainer))

    def apply(module, patcher):
        _tagging("declared")(module, patcher)
        patcher.replace(module.Trainer, "other", lambda self: "not declared")

    patch = make_patch(fake_pkg, apply=apply, changes=("Trainer.step",))
    with caplog.at_level(logging.WARNING, logger="trl_compat"):
        trl_compat.install(patch.id)
    reason = {r.id: r.reason for r in trl_compat.report()}[patch.id]
    assert trl_compat.status(patch.id) == trl_compat.FAILED
    assert "UndeclaredChange" in reason and "Trainer.other" in reason and "rolled back" in reason
    assert patch.id in caplog.text
    assert dict(vars(mod.Trainer)) == before
    assert mod.Trainer().step(1) == ("base", 1)


def test_a_declared_change_applies(fake_pkg, make_patch):
    mod = importlib.import_module(fake_pkg)
    patch = make_patch(fake_pkg, apply=_tagging("declared"), changes=(f"{fake_pkg}:Trainer.step",))
    trl_compat.install(patch.id)
    assert trl_compat.status(patch.id) == trl_compat.APPLIED
    assert mod.Trainer().step(1) == ("declared", "base", 1)


def test_the_report_names_the_declared_changes_before_the_trigger_module_is_imported(fake_pkg, make_patch):
    patch = make_patch(fake_pkg, changes=("Trainer.step", "other.module:Thing.attr"))
    trl_compat.install(patch.id)
    record = {r.id: r for r in trl_compat.report()}[patch.id]
    assert record.status == trl_compat.PENDING
    assert record.changes == (f"{fake_pkg}:Trainer.step", "other.module:Thing.attr")
    importlib.import_module(fake_pkg)
    record = {r.id: r for r in trl_compat.report()}[patch.id]
    assert record.status == trl_compat.APPLIED and record.target == f"{fake_pkg}.Trainer.step"


# -- stacking ---------------------------------------------------------------------


def test_stacking_lists_the_patches_that_declare_an_attribute_in_registry_order(fake_pkg, make_patch):
    first = make_patch(fake_pkg, changes=("Trainer.step",))
    make_patch(fake_pkg, changes=("Trainer.other",))
    third = make_patch(fake_pkg, changes=(f"{fake_pkg}:Trainer.step", f"{fake_pkg}:Trainer.other"))
    assert engine.stacking(f"{fake_pkg}:Trainer.step") == [first.id, third.id]
    assert engine.stacking(f"{fake_pkg}:Trainer.missing") == []


def test_patches_that_declare_different_attributes_do_not_stack(fake_pkg, make_patch):
    """A patch applied for the first time used to take off every later patch applied on its
    trigger module (it could not know what it would change); declared, only the later patches
    that declare an attribute it declares come off, and go back on above it."""
    mod = importlib.import_module(fake_pkg)
    applies = []
    late = make_patch(
        fake_pkg, probe=lambda m: engine.not_needed("not yet"), apply=_tagging("late", applies), changes=("Trainer.step",)
    )
    other = make_patch(fake_pkg, apply=_tagging("other", applies, name="other"), changes=("Trainer.other",))
    upper = make_patch(fake_pkg, apply=_tagging("upper", applies), changes=("Trainer.step",))
    trl_compat.install(late.id, other.id, upper.id)
    assert applies == ["other", "upper"]
    with testing.forced(late.id, probe=lambda m: engine.needed("now")):
        trl_compat.install(late.id)
    assert applies == ["other", "upper", "late", "upper"]
    assert mod.Trainer().step(1) == ("upper", "late", "base", 1)
    assert {trl_compat.status(p.id) for p in (late, other, upper)} == {trl_compat.APPLIED}


# -- the registry -----------------------------------------------------------------

INIT = f"{GRPO_MODULE}:GRPOTrainer.__init__"


def test_the_grpo_trainer_init_patches_stack_in_registry_order():
    """The patches that wrap GRPOTrainer.__init__ (peft-optional, dataloader-workers, pad-token,
    peft-gradient-checkpointing, reward-model-zero3, vllm-v1-engine...) stack in an order derived
    from their declared ``changes``: the registry's."""
    declaring = [p.id for p in PATCHES if INIT in [c if ":" in c else f"{p.trigger}:{c}" for c in p.changes]]
    derived = engine.stacking(INIT)
    # the stacking a reviewer reads in the registry, stated once here: peft-optional innermost
    # (its stand-in names must exist before any other fix's code runs), scale-rewards-swapped (TRL 0.22,
    # whose window meets no other's) outermost
    assert derived == [
        "peft-optional",
        "dataloader-workers",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-v1-engine",
        "vllm-sleep-mode-weights",
        "tools-empty-list-template",
        "colocate-generation-kwargs",  # after TRL's __init__, fills one config value (TRL 0.19.0)
        "colocate-master-port",  # before TRL's __init__ reads MASTER_PORT (TRL 0.20 - 0.23)
        "tool-iterations-zero",  # after TRL's __init__, resets one attribute (TRL 0.27+)
        "prompt-right-truncation",
        "generation-eos-ids",  # after TRL's __init__, sets TRL's own generation config (TRL 0.24+)
        "scale-rewards-swapped",
        "dora-magnitude-bf16",  # after TRL's __init__, undoes its bf16 cast of the DoRA magnitudes (TRL 0.26+)
        "peft-target-parameters-ref-adapter",  # for TRL's call only, the PeftModel passed in skips the "ref" adapter (0.27 - 1.6)
        "peft-target-parameters-ref-copy",  # makes the "ref" copy before TRL's call, inside zero3-peft-mixed-dtype (1.7 - 1.9)
        "zero3-peft-mixed-dtype",
        "peft-zero3-gc-reentrant",
        "reward-func-partial-name",  # only names the reward functions passed in: any place would do
        "server-logprobs-mode-check",  # after TRL's __init__, only asks the vLLM server and logs
        "lm-head-fp32-sharded",  # after TRL's __init__, replaces the fp32 LM heads' forward
        "ref-model-like-policy",  # only notes the trainer being built, for its create_model_from_path wrapper
        "vlm-ddp-find-unused",  # after TRL's __init__, only sets the DDP flag (args, the accelerator's handler)
    ]
    assert derived == declaring
    assert [pid for pid in (p.id for p in engine.registry()) if pid in derived] == derived


def test_the_lora_walk_patches_stack_with_the_out_of_place_merge_outermost():
    """vllm-lora-merge-drift wraps TRL >= 1.11's walk above vllm-packed-lora-sync: where it merges out
    of place it yields fresh tensors and does not call the walk below (whose copies are then not needed);
    where it leaves the sync to TRL (ZeRO-3, FSDP, a structure it does not know), the copies still run."""
    walk = "trl.generation.vllm_generation:VLLMGeneration._iter_named_params"
    assert engine.stacking(walk) == ["vllm-packed-lora-sync", "vllm-lora-merge-drift"]


LOSS = f"{GRPO_MODULE}:GRPOTrainer._compute_loss"


def test_the_compute_loss_patches_stack_in_registry_order():
    """The patches that wrap GRPOTrainer._compute_loss, innermost first. Each acts on its own calls (dapo/cispo/vespo,
    luspo, the entropy bonus of dapo/cispo/vespo, beta != 0 at the sequence level, a VLM batch's mm_token_type_ids) and
    changes only what it declares for the duration of TRL's call: kl-bias-correction-sequence sets attributes none of
    the others reads; vlm-mm-token-type-ids, outermost, only reads the inputs' mm_token_type_ids for the log-prob call."""
    declaring = [p.id for p in PATCHES if LOSS in [c if ":" in c else f"{p.trigger}:{c}" for c in p.changes]]
    derived = engine.stacking(LOSS)
    assert derived == [
        "dapo-generation-batch-normalizer",
        "luspo-unmasked-loss",
        "entropy-coef-normalizer",  # reads the normaliser through dapo-generation-batch-normalizer's rescaled_inputs
        "kl-bias-correction-sequence",
        "vlm-mm-token-type-ids",  # hands the inputs' mm_token_type_ids to the log-prob call (TRL 0.24 - 0.29.0)
    ]
    assert derived == declaring
