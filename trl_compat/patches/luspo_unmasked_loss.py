"""luspo-unmasked-loss: the LUSPO loss is masked per token before it is summed, as TRL 1.10.0.

The bug (fixed by PR #6654, in 1.10.0): PR #4988 (ff55949cc, 0.28.0) added ``loss_type="luspo"``,
aggregated in ``GRPOTrainer._compute_loss`` as ``loss = (per_token_loss * mask.sum(1,
keepdim=True)).mean()``. That is LUSPO only where ``per_token_loss`` is ``(B, 1)`` (sequence-level
importance sampling, no KL, no token-level factor). ``importance_sampling_level="token"`` (the
config's default: TRL only warns), ``beta != 0`` (the KL term), token-level vLLM importance-sampling
ratios and the entropy mask all make it ``(B, T)``: then the pad positions enter the mean and each
sequence is weighted by ``L_b * mean over T`` instead of ``sum over its L_b tokens``: silently
another objective, which also moves with the padded width T. TRL 1.10.0 writes ``loss =
(per_token_loss * mask).sum(-1).mean()``, equal to the old line on ``(B, 1)``.

Probe (``GRPOTrainer._compute_loss``): 1.10.0's line: "not needed"; no ``"luspo"`` in the method
(a build before PR #4988): "not needed". The buggy line: "needed" only if the fix below is exactly
1.10.0's, which the probe reads from the method's syntax tree:

* ``"luspo"`` and ``"dr_grpo"`` each have one aggregate branch (``self.loss_type == ...``); the
  ``dr_grpo`` one starts with ``loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) *
  self.max_completion_length)``, the ``luspo`` one with the buggy line, and the rest of the two
  branches (the gradient-accumulation normaliser, ``policy_loss`` from 1.9.0) is the same code;
* every other test of ``self.loss_type`` in the method (the shared per-token-loss branch, the vLLM
  ratio and entropy-bonus branches, the clip-ratio metrics) answers the same for both names, and
  ``self.loss_type`` is read nowhere else;
* ``self.max_completion_length`` is read once in the method, in that ``dr_grpo`` line, and neither
  name in the ``self.<helper>(...)`` methods it calls.

Anything else (an unknown aggregate, a test of the loss type that cannot be read) is "undecided".

Fix: ``GRPOTrainer._compute_loss`` is wrapped; for ``loss_type == "luspo"`` TRL's own method runs
with ``self.loss_type = "dr_grpo"`` and ``self.max_completion_length = 1`` on the instance for the
duration of the call (both restored in ``finally``, an inherited value deleted again). The
``dr_grpo`` aggregate is then ``(per_token_loss * mask).sum() / per_token_loss.size(0)``: the
masked per-sequence sum, averaged over the B sequences: 1.10.0's LUSPO line, followed by the same
normaliser, entropy bonus and metrics as the ``luspo`` branch (what the probe checked). A fix from
outside the method, because the aggregate is a local line of a long method that every release
rewrites. The Liger loss (``compute_liger_loss``, ``use_liger_kernel``, GPU only) never reaches
``_compute_loss``: its aggregate is liger-kernel's, which TRL 1.10.0 did not change; left alone.

Run time: load-bearing: errors propagate. The wrapper only sets two attributes around TRL's call;
falling back to TRL's own ``luspo`` branch on an error would be the bug, unnoticed
(``trl_compat._engine.guarded``).

Delete when: TRL < 1.10.0 is no longer supported (the registry's ``remove_when``; a test holds the
two equal).
"""

from __future__ import annotations

import ast
import functools

from trl_compat._engine import needed, not_needed, undecided
from trl_compat._helpers.source import Code, code, normalise, syntax

PATCH_ID = "luspo-unmasked-loss"
METHOD = "_compute_loss"
LOSS, STAND_IN = "luspo", "dr_grpo"
LENGTH = "max_completion_length"

_BUGGY = "loss = (per_token_loss * mask.sum(1, keepdim=True)).mean()"
_FIXED = "(per_token_loss * mask).sum(-1).mean()"
_DR_GRPO = "loss = (per_token_loss * mask).sum() / (per_token_loss.size(0) * self.max_completion_length)"


def _is_self(node, attr):
    return isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name) and node.value.id == "self"


def _answer(compare, name):
    """What ``self.loss_type <op> <constant>`` answers for ``name``; None where it cannot be read."""
    if len(compare.ops) != 1:
        return None
    op, right = compare.ops[0], compare.comparators[0]
    if isinstance(op, (ast.Eq, ast.NotEq)) and isinstance(right, ast.Constant) and isinstance(right.value, str):
        return (name == right.value) == isinstance(op, ast.Eq)
    if isinstance(op, (ast.In, ast.NotIn)) and isinstance(right, (ast.List, ast.Tuple, ast.Set)):
        values = [e.value for e in right.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(values) != len(right.elts):
            return None
        return (name in values) == isinstance(op, ast.In)
    return None


def _text(node):
    return Code(normalise(ast.unparse(node)))


def _branch(function, name):
    """The bodies of the ``if``/``elif self.loss_type == name:`` branches of ``function``."""
    return [
        node.body
        for node in ast.walk(function)
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and _is_self(node.test.left, "loss_type")
        and len(node.test.ops) == 1
        and isinstance(node.test.ops[0], ast.Eq)
        and isinstance(node.test.comparators[0], ast.Constant)
        and node.test.comparators[0].value == name
    ]


def _same_code(function):
    """None if running ``function`` as ``dr_grpo`` with max_completion_length 1 is 1.10.0's LUSPO, else why not."""
    luspo, dr_grpo = _branch(function, LOSS), _branch(function, STAND_IN)
    if len(luspo) != 1 or len(dr_grpo) != 1:
        return f"not one aggregate branch each for {LOSS!r} and {STAND_IN!r}"
    luspo, dr_grpo = luspo[0], dr_grpo[0]
    if _BUGGY not in _text(luspo[0]) or _DR_GRPO not in _text(dr_grpo[0]):
        return f"the {LOSS!r} or {STAND_IN!r} aggregate is not the known line"
    if [ast.dump(s) for s in luspo[1:]] != [ast.dump(s) for s in dr_grpo[1:]]:
        return f"the {LOSS!r} and {STAND_IN!r} branches differ after their aggregate"
    branch_tests = {
        id(node.test) for node in ast.walk(function) if isinstance(node, ast.If) and (node.body is luspo or node.body is dr_grpo)
    }
    compared = set()
    for node in ast.walk(function):
        if isinstance(node, ast.Compare) and _is_self(node.left, "loss_type"):
            compared.add(id(node.left))
            if id(node) in branch_tests:
                continue
            first, second = _answer(node, LOSS), _answer(node, STAND_IN)
            if first is None or first != second:
                return f"a test of the loss type tells {LOSS!r} from {STAND_IN!r}: {ast.unparse(node)}"
    # the error messages of the unknown-loss-type branches name it too: never reached for a known type
    compared |= {id(n) for r in ast.walk(function) if isinstance(r, ast.Raise) for n in ast.walk(r)}
    for node in ast.walk(function):
        if _is_self(node, "loss_type") and id(node) not in compared:
            return "self.loss_type is read other than in a comparison or an error message"
    lengths = [node for node in ast.walk(function) if _is_self(node, LENGTH)]
    if len(lengths) != 1 or not any(node is lengths[0] for node in ast.walk(dr_grpo[0])):
        return f"self.{LENGTH} is read outside the {STAND_IN!r} aggregate"
    return None


def _helpers_read(cls, function):
    """The ``self.<helper>(...)`` methods called by ``function`` that read the loss type or the length (or cannot be read)."""
    names = {
        node.func.attr
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
    }
    readers = []
    for name in sorted(names):
        helper = getattr(cls, name, None)
        if helper is None or "loss_type" in code(helper) or LENGTH in code(helper):
            readers.append(name)
    return readers


def probe(module):
    method = getattr(module.GRPOTrainer, METHOD, None)
    if method is None:
        return undecided(f"GRPOTrainer has no {METHOD}: unknown loss code")
    source = code(method)
    if f'"{LOSS}"' not in source:
        return not_needed(f"GRPOTrainer.{METHOD} has no {LOSS!r} loss (before PR #4988)")
    if _FIXED in source:
        return not_needed(f"the {LOSS!r} loss is masked per token before it is summed (fixed code)")
    if _BUGGY not in source:
        return undecided(f"the {LOSS!r} aggregate of GRPOTrainer.{METHOD} is not a known line")
    function = next((n for n in syntax(method).body if isinstance(n, ast.FunctionDef)), None)
    if function is None:
        return undecided(f"GRPOTrainer.{METHOD} is not a plain function")
    why = _same_code(function)
    if why is not None:
        return undecided(f"GRPOTrainer.{METHOD}: {why}: the fix cannot reuse the {STAND_IN!r} aggregate")
    readers = _helpers_read(module.GRPOTrainer, function)
    if readers:
        return undecided(f"GRPOTrainer.{METHOD} calls {', '.join(readers)}, which read the loss type or {LENGTH} (or cannot be read)")
    return needed(
        f"the {LOSS!r} loss multiplies the (B, T) per-token loss by the sequence lengths and averages over every position, pad "
        f"tokens included: wrong with token-level importance sampling (the default), a KL term, vLLM IS ratios or the entropy "
        f"mask; run as {STAND_IN!r} with {LENGTH}=1, whose aggregate is then TRL 1.10.0's masked sum per sequence"
    )


def _wrap_compute_loss(original):
    @functools.wraps(original)
    def _compute_loss(self, *args, **kwargs):
        if getattr(self, "loss_type", None) != LOSS:
            return original(self, *args, **kwargs)
        own = vars(self)
        saved = {name: own[name] for name in ("loss_type", LENGTH) if name in own}
        self.loss_type, self.max_completion_length = STAND_IN, 1
        try:
            return original(self, *args, **kwargs)
        finally:
            for name in ("loss_type", LENGTH):
                if name in saved:
                    setattr(self, name, saved[name])
                else:  # an inherited (class) value: the instance's own copy goes again
                    delattr(self, name)

    return _compute_loss


def apply(module, patcher) -> None:
    patcher.wrap(module.GRPOTrainer, METHOD, _wrap_compute_loss)
