"""vllm-is-truncated-support: with ``top_k`` / ``top_p`` / ``min_p`` truncating vLLM's sampling, the
importance-sampling correction divides the trainer's full-vocabulary log-probs by vLLM's log-probs of the
truncated, renormalised distribution: every token's ratio carries the kept probability mass.

Upstream: TRL issue #6789 (open, filed by a maintainer); PR #6880 (a warning, open); PR #7269 (this fix's
approach, "put vLLM's truncated-sampling log-probs on the trainer's support", closed unmerged). No TRL
release fixes it.

The bug: TRL 0.24.0 (PR #4163, main-branch commit e086f073c) builds its vLLM engine with
``logprobs_mode="processed_logprobs"`` (1.x: ``trl/generation/vllm_generation.py``; ``trl vllm-serve`` from
0.27.1). vLLM's processed log-probs are the log-softmax of the logits sampling used: after the temperature,
``min_p``, then ``top_k`` and ``top_p`` masking (``vllm/v1/sample/sampler.py``, ``ops/topk_topp_sampler.py``),
so over the kept tokens only: ``log(p_t / S_t)``, ``S_t`` the trainer's mass of those tokens. TRL computes
``old_per_token_logps`` as a full-vocabulary log-softmax of ``logits / T``; ``_generate_and_score_completions``
takes ``exp(old - sampling) = S_t`` as the importance-sampling ratio of a token the trainer and vLLM agree on.
Token modes scale each token's loss by ``S_t``; sequence modes (the default ``sequence_mask``) by
``prod S_t``, which falls with the completion's length and, below ``vllm_importance_sampling_clip_min``, masks
the sequence out. The off-policy sequence mask (``off_policy_mask_threshold``) reads the same difference as a
KL, and the logged ``sampling/*`` figures show ``S_t`` as mismatch. Silent.
Where it shows: TRL 0.24.0 - 1.16.0, ``use_vllm=True``, the importance-sampling correction on (the default),
``top_k > 0``, ``top_p < 1`` or ``min_p > 0`` (the trainer's fields, or ``generation_kwargs``).

How the probe recognises it
    ``GRPOTrainer._generate_and_score_completions`` forms ``old_per_token_logps - sampling_per_token_logps``
    and neither it, ``_get_per_token_logps_and_entropies`` nor ``_compute_loss`` reads ``top_k`` / ``top_p`` /
    ``min_p`` or a sampling mask, while TRL asks vLLM for ``processed_logprobs``: needed. Not needed where the
    trainer has no vLLM importance-sampling correction, or where one of those functions reads the truncation
    (the day TRL replays it, as the issue asks). Undecided where the log-prob method is missing, or the ratio or
    the engine's ``logprobs_mode`` is not written as in TRL 0.24 - 1.16.

The fix
    Compare like with like, as the issue's maintainers and PR #7269 lean: the trainer's distribution under the
    same truncation as vLLM's. Asking vLLM for raw log-probs instead is no fix: they are those of the
    temperature-1 logits (``vllm-is-raw-logprobs``), and vLLM gives no full-vocabulary tempered log-prob.
    While ``_generate_and_score_completions`` runs with truncation on, its first log-prob call (the policy's
    ``old_per_token_logps``; the reference model's come after) also records the backbone's last hidden states
    of the completion positions; from them, through the model's output embeddings and ``/ T``, the trainer's
    kept mass ``log S_t`` is replayed as vLLM truncates: ``min_p`` (``p >= min_p * p_max``), then ``top_k``
    (ties kept), then ``top_p`` over the renormalised rest (the lowest tokens whose cumulative mass is at most
    ``1 - top_p`` dropped, the top token kept), the sampled token always kept (it was sampled, so it was in
    vLLM's support; a float difference at the boundary must not drop it). That call returns
    ``old - log S_t``, the trainer's log-probs renormalised over the kept tokens, so TRL's own ratio, its modes,
    caps and masks, and the ``sampling/*`` figures compare the same distribution (1 on a healthy on-policy
    step). The batch TRL returns gets the full-vocabulary ``old_per_token_logps`` back (the PPO ratio of
    ``_compute_loss`` divides full-vocabulary log-probs by them) and ``sampling_per_token_logps + log S_t``
    (the off-policy mask compares them with full-vocabulary log-probs). The hidden states are those TRL's own
    forward computes: no second forward; the logits are formed a few hundred positions at a time.
    Self-check: where the replayed full-vocabulary log-prob of the sampled tokens differs from TRL's (mean
    over the completion tokens above 0.05 nats: a head the replay does not reproduce, e.g. logit
    soft-capping or scaling), the batch is left as TRL computed it and a warning says so once.
    Not covered: a repetition penalty (also in the processed log-probs; not a truncation), and a server
    (``vllm_mode="server"``) that returns raw log-probs (``trl vllm-serve`` before 0.27.1 without
    ``vllm-serve-raw-logprobs``).

Run time: load-bearing: errors propagate. The replay is the fix: falling back to TRL's code on an error
would be the bug, unnoticed (``trl_compat._engine.guarded``); the self-check above is the one deliberate,
announced exception.

Delete when: a TRL release replays the sampling truncation for the importance-sampling ratio (issue #6789) and
older releases are no longer supported (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from trl_compat._engine import needed, not_needed, undecided, warn_once
from trl_compat._helpers.models import peel
from trl_compat._helpers.source import code, module_code

log = logging.getLogger(__name__)

PATCH_ID = "vllm-is-truncated-support"
SCORE = "_generate_and_score_completions"
LOGPS = "_get_per_token_logps_and_entropies"
LOSS = "_compute_loss"
_IS_DIFF = "old_per_token_logps - sampling_per_token_logps"
_TRUNCATION_NAMES = ("top_k", "top_p", "min_p", "sampling_mask")
_ENGINE_MODULE = ".generation.vllm_generation"  # under TRL's package; TRL >= 0.28 builds the colocated engine there
_MISMATCH_NATS = 0.05  # mean |replayed - TRL's| full-vocabulary log-prob beyond which the replay is not trusted
_ELEMENTS = 2**25  # logits formed at once (rows x vocabulary): 128 MiB in float32, a few such buffers


def probe(module):
    cls = module.GRPOTrainer
    if getattr(cls, LOGPS, None) is None or getattr(cls, SCORE, None) is None:
        return undecided(f"GRPOTrainer has no {LOGPS} / {SCORE}: unknown log-prob code")
    score = code(getattr(cls, SCORE))
    if "vllm_importance_sampling_correction" not in score:
        return not_needed("GRPOTrainer has no vLLM importance-sampling correction")
    if _IS_DIFF not in score:
        return undecided(f"GRPOTrainer.{SCORE} does not form the importance-sampling ratio as TRL 0.24 - 1.16 do")
    names = [SCORE, LOGPS] + ([LOSS] if getattr(cls, LOSS, None) is not None else [])
    for name in names:
        text = code(getattr(cls, name))
        seen = [n for n in _TRUNCATION_NAMES if n in text]
        if seen:
            return not_needed(f"GRPOTrainer.{name} reads {', '.join(seen)}: the trainer side follows the sampling truncation")
    engine = str(code(cls.__init__))
    package, dot, _ = module.__name__.partition(".")
    if dot:  # TRL's own package: from 0.28 the colocated engine is built in trl.generation
        with contextlib.suppress(ModuleNotFoundError):
            engine += str(module_code(package + _ENGINE_MODULE))
    if "processed_logprobs" not in engine:
        return undecided("TRL does not build its vLLM engine with logprobs_mode='processed_logprobs' as 0.24 - 1.16 do")
    return needed(
        "vLLM's processed log-probs are renormalised over the tokens top_k/top_p/min_p keep, the trainer's "
        "old_per_token_logps over the whole vocabulary: each importance-sampling ratio carries the kept mass; "
        "with the patch the trainer's log-probs are replayed under the same truncation"
    )


@dataclass(frozen=True)
class Truncation:
    """vLLM's sampling truncation as the trainer asked for it (``generation_kwargs`` over the fields)."""

    temperature: float
    top_k: int = 0  # 0: off (vLLM's -1)
    top_p: float = 1.0
    min_p: float = 0.0


def truncation_of(trainer: Any) -> Truncation | None:
    """The truncation ``trainer`` samples vLLM with, or None where it samples the full distribution or its
    importance-sampling correction is off."""
    if not (getattr(trainer, "use_vllm", False) and getattr(trainer, "vllm_importance_sampling_correction", False)):
        return None
    asked = {name: getattr(trainer, name, None) for name in ("top_k", "top_p", "min_p")}
    overrides = getattr(getattr(trainer, "args", None), "generation_kwargs", None) or {}
    asked.update({name: overrides[name] for name in asked if name in overrides})
    top_k = int(asked["top_k"]) if asked["top_k"] is not None else 0
    top_p = float(asked["top_p"]) if asked["top_p"] is not None else 1.0
    min_p = float(asked["min_p"]) if asked["min_p"] is not None else 0.0
    if top_k <= 0 and top_p >= 1.0 and min_p <= 0.0:
        return None
    return Truncation(float(trainer.temperature), max(top_k, 0), top_p, min_p)


def kept_mask(logits, tokens, truncation: Truncation):
    """The tokens vLLM's sampler keeps from tempered ``logits`` [N, V]: min_p, then top_k, then top_p (vLLM's
    ``MinPLogitsProcessor`` and ``apply_top_k_top_p``), each ``tokens`` [N] kept."""
    import torch

    keep = torch.ones_like(logits, dtype=torch.bool)
    if truncation.min_p > 0.0:
        probs = logits.softmax(dim=-1)
        keep &= probs >= truncation.min_p * probs.amax(dim=-1, keepdim=True)
    if 0 < truncation.top_k < logits.size(-1):
        masked = logits.masked_fill(~keep, -math.inf)
        keep &= masked >= masked.topk(truncation.top_k, dim=-1).values[:, -1:]
    if truncation.top_p < 1.0:
        ascending, order = logits.masked_fill(~keep, -math.inf).sort(dim=-1)
        drop = ascending.softmax(dim=-1).cumsum(dim=-1) <= 1.0 - truncation.top_p
        drop[:, -1] = False
        keep &= ~torch.zeros_like(drop).scatter(-1, order, drop)
    return keep.scatter(-1, tokens.unsqueeze(-1), True)


def log_kept_mass(logits, tokens, truncation: Truncation):
    """(log S, the full-vocabulary log-prob of ``tokens``) for tempered ``logits`` [N, V]."""
    logits = logits.float()
    total = logits.logsumexp(dim=-1)
    kept = logits.masked_fill(~kept_mask(logits, tokens, truncation), -math.inf).logsumexp(dim=-1)
    return kept - total, logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - total


@dataclass
class _Call:
    """One ``_generate_and_score_completions`` call with truncation on."""

    trainer: Any
    truncation: Truncation
    done: bool = False  # the old-log-prob call has been seen
    old_full: Any = None  # TRL's full-vocabulary old_per_token_logps
    returned: Any = None  # what the patched call handed TRL instead
    log_kept: Any = None  # log S, [B, K]
    hidden: list = field(default_factory=list)


_CURRENT: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("trl_compat_truncated_support", default=None)


@contextlib.contextmanager
def _last_hidden_states(model: Any, keep: int, into: list):
    """Record, per forward of ``model``'s backbone, its last hidden states at the ``keep`` positions that predict
    the completion tokens ([:, -keep - 1:-1])."""
    backbone = peel(model).base_model

    def hook(_module, _args, output):
        states = output.last_hidden_state if hasattr(output, "last_hidden_state") else output[0]
        into.append(states[:, -keep - 1 : -1].detach())

    handle = backbone.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _replay(model: Any, input_ids, attention_mask, keep: int, hidden: list, truncation: Truncation):
    """(log S [B, K], the replayed full-vocabulary log-probs [B, K]) of the completion tokens."""
    import torch

    head = peel(model).get_output_embeddings()
    states = torch.cat(hidden, dim=0)
    tokens = input_ids[:, -keep:].to(states.device)
    flat_states, flat_tokens = states.reshape(-1, states.size(-1)), tokens.reshape(-1)
    rows = max(1, _ELEMENTS // head.weight.size(0))
    log_kept, full = [], []
    with torch.no_grad():
        for start in range(0, flat_tokens.numel(), rows):
            logits = head(flat_states[start : start + rows].to(head.weight.dtype)).float() / truncation.temperature
            kept, logp = log_kept_mass(logits, flat_tokens[start : start + rows], truncation)
            log_kept.append(kept)
            full.append(logp)
    return torch.cat(log_kept).view_as(tokens), torch.cat(full).view_as(tokens)


def _wrap_logps(original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
        call = _CURRENT.get()
        # the first log-prob call of the batch is the policy's old_per_token_logps (TRL 0.24 - 1.16)
        if call is None or call.done or call.trainer is not self:
            return original(self, model, *args, **kwargs)
        call.done = True
        bound = signature.bind(self, model, *args, **kwargs).arguments
        keep = int(bound["logits_to_keep"])
        with _last_hidden_states(model, keep, call.hidden):
            result = original(self, model, *args, **kwargs)
        old = result[0]
        log_kept, replayed = _replay(model, bound["input_ids"], bound["attention_mask"], keep, call.hidden, call.truncation)
        call.hidden.clear()
        valid = bound["attention_mask"][:, -keep:].to(old.device).bool()
        mismatch = (replayed.to(old.device) - old.float()).abs()[valid]
        if mismatch.numel() and mismatch.mean().item() > _MISMATCH_NATS:
            warn_once(
                log,
                PATCH_ID,
                "trl_compat %s: the replayed log-probs differ from TRL's by %.3f nats a token (a model head the replay "
                "does not reproduce); the importance-sampling ratio keeps the truncated-support bias (TRL #6789)",
                PATCH_ID,
                mismatch.mean().item(),
            )
            return result
        call.old_full, call.log_kept = old, log_kept.to(old.device, old.dtype)
        call.returned = old - call.log_kept
        return (call.returned, *result[1:])

    return _get_per_token_logps_and_entropies


def _wrap_score(original):
    @functools.wraps(original)
    def _generate_and_score_completions(self, *args, **kwargs):
        truncation = truncation_of(self)
        if truncation is None:
            return original(self, *args, **kwargs)
        call = _Call(self, truncation)
        token = _CURRENT.set(call)
        try:
            output = original(self, *args, **kwargs)
        finally:
            _CURRENT.reset(token)
        if call.log_kept is not None and isinstance(output, dict):
            if output.get("old_per_token_logps") is call.returned:
                output["old_per_token_logps"] = call.old_full
            sampling = output.get("sampling_per_token_logps")
            if sampling is not None:
                output["sampling_per_token_logps"] = sampling + call.log_kept.to(sampling.device, sampling.dtype)
        return output

    return _generate_and_score_completions


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, LOGPS, _wrap_logps)
    patcher.wrap(module.GRPOTrainer, SCORE, _wrap_score)
