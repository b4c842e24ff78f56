"""kl-bias-correction-sequence: the KL bias correction multiplies each token's KL by that token's ratio.

The bug (TRL issue #6586, open; PR #7188 "Multiply the KL term by the per-token importance sampling
ratio", open, the fix maintainers lean to; PR #6594, the same fix, closed unmerged): PR #4638
(main-branch commit f7d4985a7, 0.26.0) added ``use_bias_correction_kl`` (opt-in; the default since
1.10.0, PR #6503), the DeepSeek-V3.2 correction of the k3 KL estimator. ``GRPOTrainer._compute_loss``
writes it ``per_token_kl = per_token_kl * coef_1``, with ``coef_1 = torch.exp(log_importance_weights)``
the policy's ratio. With ``importance_sampling_level="token"`` that is the per-token ratio
``pi/pi_old`` of the paper. With ``"sequence"`` (GSPO) the sequence branch makes
``log_importance_weights`` the masked mean of the log-ratios, unsqueezed to ``(B, 1)``: one sequence
weight is broadcast onto the per-token KL. Its value is not the per-token correction once the policy
has moved (``num_iterations > 1``, ``steps_per_generation > gradient_accumulation_steps``), and the
gradient has a spurious term ``(sum_t k3_t) * grad mean_t log pi_t`` at every step, even on-policy
where the ratio's value is 1 (the ratio is differentiable). Silent, whenever ``beta != 0`` with the
sequence level and the correction on. TRL 0.26.0 - 1.16.0 (read in 0.26.0, 1.0.0, 1.9.2, 1.12.0 and
1.16.0: the same lines).

How the probe recognises it (``GRPOTrainer._compute_loss``'s syntax tree): no
``use_bias_correction_kl`` (before PR #4638): "not needed". The ``if self.args.use_bias_correction_kl:``
branch multiplies ``per_token_kl`` by ``torch.exp(log_ratio)`` or a name bound to it, ``log_ratio =
per_token_logps - old_per_token_logps`` (PR #7188's form): "not needed". It multiplies by ``coef_1``,
``coef_1 = torch.exp(log_importance_weights)`` and the ``"sequence"`` branch unsqueezes
``log_importance_weights`` to ``(B, 1)``: "needed", where the method also has every line the fix
relies on: ``self.beta`` read only as ``self.beta != 0.0`` and in one ``self.beta * per_token_kl``
(and by none of the ``self.<helper>(...)`` it calls), the flag read once, one call of
``_get_per_token_logps_and_entropies`` whose first result is ``per_token_logps``, and the
``old_per_token_logps`` lines (``inputs.get(...)``, ``per_token_logps.detach()`` where it is None).
Anything else: "undecided".

Fix (PR #7188's KL term, from outside the method): ``GRPOTrainer._compute_loss`` is wrapped. For a call
with ``beta != 0``, ``importance_sampling_level == "sequence"`` and ``use_bias_correction_kl`` on, TRL's
own method runs with, for the duration of the call (all restored in ``finally``):

* ``self.args.use_bias_correction_kl = False``: TRL's ``per_token_kl`` is the plain k3 estimate;
* ``self.beta`` a ``float`` of the same value (so ``self.beta != 0.0`` answers as before) whose
  ``self.beta * per_token_kl`` is ``beta * (per_token_kl * exp(per_token_logps - old_per_token_logps))``:
  the per-token ratio PR #7188 uses, with the log-probs TRL's call computed (read through an
  instance-level spy on ``_get_per_token_logps_and_entropies``) and the ``old_per_token_logps`` TRL reads
  (``per_token_logps.detach()`` where the batch has none, as TRL);
* everything else is TRL's: the policy term keeps the sequence-level ``coef_1``, the loss's aggregate,
  normaliser, entropy bonus and the other ``_compute_loss`` patches stacked below are untouched. The
  logged ``kl`` metric is TRL's ``per_token_kl``: the uncorrected k3 mean (PR #7188 logs the corrected
  one). The token level, ``beta == 0`` and the correction switched off run TRL's code untouched. The Liger
  loss (``use_liger_kernel``, GPU only) never reaches ``_compute_loss``: left alone.

A fix from outside the method, because the product is a local line of a long method every release
rewrites; the probe holds the one arithmetic use of ``self.beta`` the fix relies on.

Run time: load-bearing: errors propagate. What the wrapper sets is the fix itself: falling back to
TRL's code on an error would be the bug, unnoticed (``trl_compat._engine.guarded``).

Delete when: a TRL release multiplies the KL by the per-token importance-sampling ratio (issue #6586)
and older releases are no longer supported (the registry's ``remove_when``; a test holds the two equal).
"""

from __future__ import annotations

import ast
import functools

from trl_compat._engine import instance_overrides, needed, not_needed, undecided
from trl_compat._helpers.arguments import arguments
from trl_compat._helpers.source import code, syntax

PATCH_ID = "kl-bias-correction-sequence"
METHOD = "_compute_loss"
FLAG = "use_bias_correction_kl"
LOGPS = "_get_per_token_logps_and_entropies"

_RELIED_ON = (
    'old_per_token_logps = inputs.get("old_per_token_logps")',
    "old_per_token_logps = per_token_logps.detach() if old_per_token_logps is None else old_per_token_logps",
)


def _is_attr(node, *path):
    """``node`` is the dotted name ``path`` (``self.args.use_bias_correction_kl``: "self", "args", ...)."""
    for name in reversed(path[1:]):
        if not (isinstance(node, ast.Attribute) and node.attr == name):
            return False
        node = node.value
    return isinstance(node, ast.Name) and node.id == path[0]


def _is_call(node, func, arg):
    """``node`` is ``torch.<func>(<arg>)``."""
    return (
        isinstance(node, ast.Call)
        and _is_attr(node.func, "torch", func)
        and len(node.args) == 1
        and not node.keywords
        and isinstance(node.args[0], ast.Name)
        and node.args[0].id == arg
    )


def _assigned(function, name):
    """The values assigned to the plain name ``name`` anywhere in ``function``."""
    return [
        node.value
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets)
    ]


def _kl_factor(function):
    """The ``X`` of ``per_token_kl = per_token_kl * X`` in the one ``if self.args.use_bias_correction_kl:``; else why not."""
    branches = [n for n in ast.walk(function) if isinstance(n, ast.If) and _is_attr(n.test, "self", "args", FLAG)]
    if len(branches) != 1 or len(branches[0].body) != 1 or branches[0].orelse:
        return None, f"not one plain `if self.args.{FLAG}:` branch"
    statement = branches[0].body[0]
    if not (
        isinstance(statement, ast.Assign)
        and len(statement.targets) == 1
        and isinstance(statement.targets[0], ast.Name)
        and statement.targets[0].id == "per_token_kl"
        and isinstance(statement.value, ast.BinOp)
        and isinstance(statement.value.op, ast.Mult)
        and isinstance(statement.value.left, ast.Name)
        and statement.value.left.id == "per_token_kl"
    ):
        return None, f"the `{FLAG}` branch is not `per_token_kl = per_token_kl * <ratio>`"
    return statement.value.right, None


def _per_token(function, factor):
    """``factor`` is ``torch.exp(log_ratio)`` (or a name bound only to it), ``log_ratio`` the per-token log-ratio."""
    if isinstance(factor, ast.Name):
        values = _assigned(function, factor.id)
        if len(values) != 1:
            return False
        factor = values[0]
    if not _is_call(factor, "exp", "log_ratio"):
        return False
    ratios = _assigned(function, "log_ratio")
    return len(ratios) == 1 and ast.unparse(ratios[0]) == "per_token_logps - old_per_token_logps"


def _sequence_weight(function):
    """``coef_1 = torch.exp(log_importance_weights)`` and a ``"sequence"`` branch that unsqueezes them to (B, 1)."""
    if not any(_is_call(v, "exp", "log_importance_weights") for v in _assigned(function, "coef_1")):
        return False
    for node in ast.walk(function):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and _is_attr(node.test.left, "self", "importance_sampling_level")
            and len(node.test.ops) == 1
            and isinstance(node.test.ops[0], ast.Eq)
            and isinstance(node.test.comparators[0], ast.Constant)
            and node.test.comparators[0].value == "sequence"
        ):
            body = ast.Module(body=node.body, type_ignores=[])
            return any(ast.unparse(v) == "log_importance_weights.unsqueeze(-1)" for v in _assigned(body, "log_importance_weights"))
    return False


def _beta_reads(function):
    """None if ``self.beta`` is read only as ``self.beta != 0.0`` and in one ``self.beta * per_token_kl``; else why not."""
    allowed, products = set(), 0
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and _is_attr(node.left, "self", "beta"):
            zero = node.comparators[0]
            if len(node.ops) == 1 and isinstance(node.ops[0], ast.NotEq) and isinstance(zero, ast.Constant) and zero.value == 0:
                allowed.add(id(node.left))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and _is_attr(node.left, "self", "beta"):
            if isinstance(node.right, ast.Name) and node.right.id == "per_token_kl":
                allowed.add(id(node.left))
                products += 1
    if products != 1:
        return f"not one `self.beta * per_token_kl` ({products})"
    if any(_is_attr(n, "self", "beta") and id(n) not in allowed for n in ast.walk(function)):
        return "self.beta is read other than in `self.beta != 0.0` and `self.beta * per_token_kl`"
    return None


def _relied_on(cls, function, source):
    """None if the method has every line the fix relies on; else the first it lacks."""
    why = _beta_reads(function)
    if why is not None:
        return why
    if sum(_is_attr(n, "self", "args", FLAG) for n in ast.walk(function)) != 1:
        return f"self.args.{FLAG} is read more than once"
    calls = [
        node
        for node in ast.walk(function)
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _is_attr(node.value.func, "self", LOGPS)
    ]
    every = [n for n in ast.walk(function) if isinstance(n, ast.Call) and _is_attr(n.func, "self", LOGPS)]
    if len(calls) != 1 or len(every) != 1:
        return f"not one call of self.{LOGPS}"
    target = calls[0].targets[0]
    if not (isinstance(target, ast.Tuple) and isinstance(target.elts[0], ast.Name) and target.elts[0].id == "per_token_logps"):
        return f"the first result of self.{LOGPS} is not per_token_logps"
    missing = [line for line in _RELIED_ON if line not in source]
    if missing:
        return f"no `{missing[0]}`"
    helpers = {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and _is_attr(node.func.value, "self")
    }
    for name in sorted(helpers):
        helper = getattr(cls, name, None)
        if helper is None or "self.beta" in code(helper):
            return f"self.{name}, which it calls, reads self.beta (or cannot be read)"
    return None


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}: unknown loss code")
    source = code(method)
    if FLAG not in source:
        return not_needed(f"GRPOTrainer.{METHOD} has no {FLAG} (before PR #4638, TRL 0.26.0)")
    function = next((n for n in syntax(method).body if isinstance(n, ast.FunctionDef)), None)
    if function is None:
        return undecided(f"GRPOTrainer.{METHOD} is not a plain function")
    factor, why = _kl_factor(function)
    if factor is None:
        return undecided(f"GRPOTrainer.{METHOD}: {why}")
    if _per_token(function, factor):
        return not_needed("the KL bias correction multiplies the KL by the per-token ratio (fixed code)")
    if not (isinstance(factor, ast.Name) and factor.id == "coef_1" and _sequence_weight(function)):
        return undecided(f"the KL bias correction of GRPOTrainer.{METHOD} multiplies by an unknown ratio: {ast.unparse(factor)}")
    why = _relied_on(module.GRPOTrainer, function, source)
    if why is not None:
        return undecided(f"GRPOTrainer.{METHOD}: {why}: the fix cannot replace the KL's ratio from outside")
    return needed(
        f"{FLAG} multiplies the per-token KL by coef_1, which importance_sampling_level='sequence' makes the (B, 1) "
        "sequence ratio: a spurious KL gradient whenever beta != 0; the KL is multiplied by the per-token ratio instead, "
        "as PR #7188"
    )


class PerTokenKLWeight(float):
    """``beta`` for TRL's comparisons; ``beta * per_token_kl`` multiplies each token's KL by its ratio ``ratio()``."""

    def __new__(cls, beta, ratio):
        weight = super().__new__(cls, beta)
        weight.ratio = ratio
        return weight

    def __mul__(self, other):
        import torch

        if isinstance(other, torch.Tensor):
            return float(self) * (other * self.ratio())
        return float(self) * other


def _affected(trainer):
    args = getattr(trainer, "args", None)
    return (
        getattr(args, FLAG, False) is True
        and getattr(trainer, "importance_sampling_level", None) == "sequence"
        and getattr(trainer, "beta", 0.0) != 0.0
    )


def _wrap_compute_loss(original):
    @functools.wraps(original)
    def _compute_loss(self, *args, **kwargs):
        if not _affected(self):
            return original(self, *args, **kwargs)
        inputs = arguments(original, self, *args, **kwargs)["inputs"]
        seen: list = []
        logps = getattr(self, LOGPS)

        def spy(*a, **k):  # the log-probs TRL's call computes, handed on unchanged
            out = logps(*a, **k)
            seen.append(out[0])
            return out

        def ratio():
            import torch

            if not seen:
                raise RuntimeError(f"{PATCH_ID}: the KL was weighted before GRPOTrainer.{LOGPS} ran")
            per_token_logps = seen[0]
            old = inputs.get("old_per_token_logps")
            old = per_token_logps.detach() if old is None else old
            return torch.exp(per_token_logps - old)

        with (
            instance_overrides(self.args, **{FLAG: False}),
            instance_overrides(self, **{LOGPS: spy, "beta": PerTokenKLWeight(self.beta, ratio)}),
        ):
            return original(self, *args, **kwargs)

    return _compute_loss


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap_compute_loss)
