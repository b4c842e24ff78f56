"""Every registry entry is a whole declaration: what it changes, the versions its window tests
feed through the gate, and what a user sees without it (runs in every cell, no trl needed)."""

import importlib.util
import pathlib
import re

from trl_compat.patches import PATCHES, declared

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
# "Qual.name" inside the trigger module, or "module:Qual.name" elsewhere
CHANGE = re.compile(rf"(?:{IDENTIFIER}(?:\.{IDENTIFIER})*:)?{IDENTIFIER}(?:\.{IDENTIFIER})*")
# the exception line a user would search for, or what silently goes wrong
SYMPTOM = re.compile(r"^silent: \S|\b[A-Z]\w*(?:Error|Exception): \S")


def admits_every_version(spec: str) -> bool:
    """A window that only asks for the distribution to be installed (``>=0``): nothing is outside."""
    window = SpecifierSet(spec, prereleases=True)
    return Version("0") in window and Version("99.0") in window


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_every_entry_declares_what_it_changes(patch):
    assert patch.changes, f"{patch.id} declares no changes"
    assert isinstance(patch.changes, tuple)
    for change in patch.changes:
        assert isinstance(change, str) and CHANGE.fullmatch(change), f"{patch.id}: {change!r}"
    assert len(set(patch.changes)) == len(patch.changes), f"{patch.id} lists a change twice"


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_every_window_has_witnesses_inside_and_outside(patch):
    assert set(patch.witnesses) <= set(patch.requires), f"{patch.id}: witnesses for a distribution it does not require"
    for dist, spec in patch.requires.items():
        named = patch.witnesses.get(dist)
        if named is None:
            assert admits_every_version(spec), f"{patch.id}: {dist} {spec} has no witnesses"
            continue
        assert set(named) <= {"inside", "outside"}, f"{patch.id}: {dist}: {sorted(named)}"
        assert named["inside"], f"{patch.id}: no {dist} version named inside {spec}"
        assert named.get("outside") or admits_every_version(spec), f"{patch.id}: no {dist} version named outside {spec}"
        for version in (*named["inside"], *named.get("outside", ())):
            Version(version)  # a real version, not a typo


@pytest.mark.parametrize("patch", PATCHES, ids=lambda p: p.id)
def test_every_entry_says_what_a_user_sees_without_it(patch):
    assert patch.symptom.strip() == patch.symptom and "\n" not in patch.symptom, patch.symptom
    assert SYMPTOM.search(patch.symptom), f"{patch.id}: {patch.symptom!r} is neither an error line nor 'silent: ...'"
    assert patch.symptom != patch.summary


def test_ids_are_unique_and_declared_finds_each():
    ids = [patch.id for patch in PATCHES]
    assert len(set(ids)) == len(ids)
    assert [declared(i) for i in ids] == PATCHES
    with pytest.raises(KeyError):
        declared("no-such-patch")


def test_the_init_patches_declare_it():
    """Their order on GRPOTrainer.__init__ is derived from these declarations (the registry's);
    none depends on it: each hook reads the call's arguments or the finished trainer."""
    init = [patch.id for patch in PATCHES if "GRPOTrainer.__init__" in patch.changes]
    assert init == [
        "peft-optional",
        "dataloader-workers",
        "pad-token",
        "peft-gradient-checkpointing",
        "reward-model-zero3",
        "vllm-v1-engine",
        "vllm-sleep-mode-weights",  # registers the colocated engine after TRL built it (TRL 0.25+)
        "tools-empty-list-template",  # an empty tools list becomes None after TRL's __init__ (0.26.0, 0.28 - 0.29.1)
        "colocate-generation-kwargs",  # after TRL's __init__, fills one config value (TRL 0.19.0)
        "colocate-master-port",  # before TRL's __init__ reads MASTER_PORT (TRL 0.20 - 0.23)
        "tool-iterations-zero",  # after TRL's __init__, resets one attribute (TRL 0.27+)
        "prompt-right-truncation",
        "generation-eos-ids",  # after TRL's __init__, sets TRL's own generation config (TRL 0.24+)
        "scale-rewards-swapped",
        "dora-magnitude-bf16",  # after TRL's __init__, undoes its bf16 cast of the DoRA magnitudes (TRL 0.26+)
        "peft-target-parameters-ref-adapter",  # for TRL's call only, the PeftModel passed in skips the "ref" adapter (0.27 - 1.6)
        "peft-target-parameters-ref-copy",  # makes the "ref" copy before TRL's call, inside zero3-peft-mixed-dtype (1.7 - 1.9)
        "zero3-peft-mixed-dtype",  # casts a PeftModel's fp32 adapters before TRL's __init__ (DeepSpeed 0.19.2)
        "peft-zero3-gc-reentrant",  # sets use_reentrant before TRL's __init__ reads the config
        "reward-func-partial-name",  # only names the reward functions passed in: any place would do
        "server-logprobs-mode-check",  # after TRL's __init__, only asks the vLLM server and logs (TRL 1.11 - 1.15)
        "lm-head-fp32-sharded",  # after TRL's __init__, replaces the fp32 LM heads' forward (TRL 0.25 - 1.8)
        "ref-model-like-policy",  # notes the trainer being built for its create_model_from_path wrapper (TRL 0.26+)
        "vlm-ddp-find-unused",  # after TRL's __init__, sets the DDP flag on args and the accelerator (TRL 0.20 - 1.15)
    ]


def _impl_source(patch) -> str:
    path = pathlib.Path(importlib.util.find_spec(patch.impl).origin)
    files = sorted(path.parent.glob("*.py")) if path.name == "__init__.py" else [path]
    return "".join(f.read_text(encoding="utf-8") for f in files)


@pytest.mark.parametrize("patch", [p for p in PATCHES if "GRPOTrainer.__init__" in p.changes], ids=lambda p: p.id)
def test_every_init_fix_goes_through_around_init(patch):
    source = _impl_source(patch)
    assert "around_init(" in source, f"{patch.impl} wraps GRPOTrainer.__init__ without trl_compat._helpers.trainer_init"
    assert not re.search(r"""\.wrap\([^)]*["']__init__["']""", source), f"{patch.impl} wraps __init__ itself"
