"""What the advice-only entries share: known breaks between a pinned TRL and a newer (or older)
vLLM / transformers / peft that trl_compat does not patch, because no small fix can be proved
on the CPU, and that an upgrade of one package ends for good.

Their probe says "undecided" with the upgrade to make (the gate has already found every
package inside its window), so the report names the break and ``TRL_COMPAT_STRICT=1`` stops the
run at ``import trl`` with the same message, before hours of set-up end in the crash. Their
``apply`` refuses: the engine never calls it on "undecided", and it must not fix anything if it
ever were. Each entry's ``changes`` names the attribute a real fix would change, so that a later
fix stacks where the entry says.

Remove this patch when the last advice-only entry is removed (this module is their shared part).
"""

from __future__ import annotations

from trl_compat._engine import undecided, versions

# Where TRL 0.26.0 - 1.2.x shim vLLM's bugs themselves (trl/__init__.py in 0.26, trl/_compat.py from
# 0.27); PR #5549 (0a54b4d19, TRL 1.3.0) removed the vLLM shims when TRL required vLLM >= 0.12.
TRL_SHIM_MODULES = ("trl._compat", "trl")


def installed(*dists: str) -> str:
    """``"vllm 0.10.2, huggingface_hub 1.2.0"``: the installed versions, read from metadata."""
    return ", ".join(f"{dist} {versions.dist_version(dist) or 'not installed'}" for dist in dists)


def advise(what_breaks: str, dists: tuple, upgrade: str):
    """The "undecided" verdict: what breaks on the installed versions, then what to upgrade."""
    return undecided(f"{what_breaks} ({installed(*dists)}); {upgrade}")


def trl_shims(needle: str) -> bool:
    """Whether TRL's own compatibility code (read, not imported) has ``needle``: the line of its
    shim of a vLLM bug."""
    from trl_compat._helpers.source import module_code

    for name in TRL_SHIM_MODULES:
        try:
            if needle in module_code(name):
                return True
        except ModuleNotFoundError:
            continue  # TRL < 0.27 has no trl/_compat.py
    return False


def refusing_apply(patch_id: str):
    """An ``apply`` for an entry that advises and never patches."""

    def apply(module, patcher):
        raise NotImplementedError(f"{patch_id} only advises an upgrade: it has no fix to apply")

    return apply
