"""Static check: every tensor trl_compat creates takes its device from the tensors it meets.

A patch is tested on the CPU in float32, but runs on CUDA in bf16: a ``torch.zeros(n)`` built on the
CPU and combined with a CUDA tensor raises there (or a CPU mask indexes a CUDA tensor: TRL's own
#5218), and a float32 default meets bf16 values. This reads every module under ``trl_compat/`` (ast
only: nothing is imported) and reports each call that creates a tensor from nothing
(``torch.tensor``, ``zeros``, ``ones``, ``full``, ``arange``, ``empty``, ``rand*``, ...):

* without ``device=`` (or with a constant one: ``"cpu"``, ``torch.device("cpu")``), which puts it on
  the CPU whatever the run's device;
* a legacy constructor (``torch.Tensor(...)``, ``torch.LongTensor(...)``) or ``torch.from_numpy``,
  which takes no device at all;
* for the creations that are float32 by default (``zeros``, ``ones``, ``empty``, ``rand``, ...),
  without ``dtype=``.

``torch.*_like`` and ``tensor.new_*`` take both from their tensor and are never reported.

A finding is fixed (``device=other.device, dtype=other.dtype``) or, where the CPU tensor is meant,
marked with its reason: ``# device-ok: <why it is safe>`` on a line of the call or the line above it,
or an entry in ``ALLOWED`` below (for files whose code is not to carry the marker). An ``ALLOWED``
entry that no longer matches a call is reported too, so that the list cannot outlive the code.

    python tools/check_tensor_devices.py [PATH ...]     default: trl_compat/; exit status 1 on a finding
"""

from __future__ import annotations

import ast
import io
import os
import sys
import tokenize
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = "trl_compat"
MARKER = "device-ok:"

CREATORS = frozenset(
    {
        "tensor", "as_tensor", "asarray", "scalar_tensor", "zeros", "ones", "full", "empty", "empty_strided",
        "arange", "range", "linspace", "logspace", "eye", "rand", "randn", "randint", "randperm", "normal",
        "tril_indices", "triu_indices",
    }
)  # fmt: skip
# float32 whatever the run's dtype, unless dtype= says otherwise
FLOAT_BY_DEFAULT = frozenset({"zeros", "ones", "empty", "empty_strided", "rand", "randn", "linspace", "logspace", "eye"})
NO_DEVICE_ARGUMENT = frozenset(
    {"Tensor", "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "BoolTensor", "from_numpy"}
)

# (path under the repository, the call as ast.unparse writes it) -> why the CPU tensor is meant. For
# the off-policy guard, whose checks do their arithmetic on CPU float64 copies on purpose.
ALLOWED: dict[tuple[str, str], str] = {
    ("trl_compat/guard/checks/watched.py", "torch.zeros(len(watch.index), dtype=torch.float64)"): (
        "the LoRA delta's accumulators: every term added to them is a weight copied .to('cpu', torch.float64) first"
    ),
    ("trl_compat/guard/checks/logprobs.py", "torch.tensor(sampled.logprobs, dtype=torch.float64)"): (
        "vLLM's log-probs (Python floats) in CPU float64; the trainer's are moved .to('cpu', torch.float64) to meet them"
    ),
    ("trl_compat/guard/checks/logprobs_gate.py", "torch.empty(0)"): (
        "a default whose .dtype alone is read (an engine model without parameters); never combined with a tensor"
    ),
    ("trl_compat/guard/_engines.py", "torch.randperm(numel, generator=generator)"): (
        "the sampled indices: drawn by a CPU generator so they are the same on every rank, moved .to(param.device) where they index"
    ),
    ("trl_compat/guard/_engines.py", "torch.arange(numel)"): (
        "the sampled indices of a small matrix (all of them): moved .to(param.device) where they index, as the drawn ones"
    ),
}


class Finding(NamedTuple):
    path: str
    line: int
    call: str
    problem: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.call}: {self.problem}"


def _torch_names(tree: ast.AST) -> tuple[set[str], dict[str, str]]:
    """The names bound to the torch module, and the names imported from it (local name -> torch's)."""
    modules, functions = {"torch"}, {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "torch":
                    modules.add(alias.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and node.module == "torch" and not node.level:
            for alias in node.names:
                functions[alias.asname or alias.name] = alias.name
    return modules, functions


def _created(call: ast.Call, modules: set[str], functions: dict[str, str]) -> str | None:
    """The torch function a call names, when it is one that creates a tensor."""
    func = call.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id in modules:
        name = func.attr
    elif isinstance(func, ast.Name) and func.id in functions:
        name = functions[func.id]
    else:
        return None
    return name if name in CREATORS or name in NO_DEVICE_ARGUMENT else None


def _constant_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True  # "cpu", "cuda", 0, None
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "device"
        and all(isinstance(arg, ast.Constant) for arg in node.args)
    )


def _problem(name: str, call: ast.Call) -> str | None:
    if name in NO_DEVICE_ARGUMENT:
        return f"torch.{name} takes no device: build it with torch.tensor/empty(..., device=...) or .to(other.device)"
    keywords = {kw.arg: kw.value for kw in call.keywords}
    if None in keywords:  # **kwargs: what it passes is not readable here
        return None
    if "device" not in keywords:
        return "no device=: the tensor is built on the CPU whatever device the tensors it meets are on"
    if _constant_device(keywords["device"]):
        return "a constant device=: take it from the tensors it is combined with"
    if name in FLOAT_BY_DEFAULT and "dtype" not in keywords:
        return "no dtype=: float32 by default, whatever the dtype (bf16) of the tensors it meets"
    return None


def _marked_lines(source: str) -> dict[int, str]:
    """line -> the reason of a ``# device-ok:`` comment on it ('' when none is given)."""
    marks = {}
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.COMMENT and MARKER in token.string:
                marks[token.start[0]] = token.string.split(MARKER, 1)[1].strip()
    except (tokenize.TokenError, SyntaxError):
        pass
    return marks


def check_source(
    source: str, path: str = "<snippet>", allowed: dict[tuple[str, str], str] | None = None, used: set[tuple[str, str]] | None = None
) -> list[Finding]:
    """The findings of one module's source; ``used`` collects the ``allowed`` entries that matched."""
    allowed = ALLOWED if allowed is None else allowed
    tree = ast.parse(source, filename=path)
    modules, functions = _torch_names(tree)
    marks = _marked_lines(source)
    findings = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _created(node, modules, functions)
        if name is None:
            continue
        problem = _problem(name, node)
        if problem is None:
            continue
        text = ast.unparse(node)
        entry = (path, text)
        if allowed.get(entry, "").strip():
            if used is not None:
                used.add(entry)
            continue
        lines = range(node.lineno - 1, (node.end_lineno or node.lineno) + 1)
        reasons = [marks[line] for line in lines if line in marks]
        if any(reasons):
            continue
        if reasons:
            problem += f" (its '# {MARKER}' marker gives no reason)"
        findings.append(Finding(path, node.lineno, text if len(text) <= 100 else text[:97] + "...", problem))
    return sorted(findings, key=lambda f: f.line)


def python_files(paths: list[str]) -> list[str]:
    files = []
    for path in paths:
        if os.path.isfile(path):
            files.append(path)
            continue
        for folder, dirs, names in os.walk(path):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            files += [os.path.join(folder, n) for n in sorted(names) if n.endswith(".py")]
    return files


def check_tree(
    paths: list[str] | None = None, root: str = ROOT, allowed: dict[tuple[str, str], str] | None = None
) -> tuple[list[Finding], list[str]]:
    """(findings, stale allow-list entries) over ``paths`` (default: the package)."""
    allowed = ALLOWED if allowed is None else allowed
    used: set[tuple[str, str]] = set()
    findings: list[Finding] = []
    seen = set()
    for file in python_files(paths or [os.path.join(root, PACKAGE)]):
        rel = os.path.relpath(os.path.abspath(file), root).replace(os.sep, "/")
        seen.add(rel)
        with open(file, encoding="utf-8") as handle:
            findings += check_source(handle.read(), rel, allowed, used)
    stale = [f"ALLOWED[{key!r}] matches no call" for key in allowed if key[0] in seen and key not in used]
    return findings, stale


def main(argv: list[str]) -> int:
    findings, stale = check_tree(argv or None)
    for line in [str(f) for f in findings] + stale:
        print(line)
    if findings or stale:
        print(
            f"{len(findings)} tensor creation(s) without their device, {len(stale)} stale allow-list entr(y/ies): "
            f"take device=/dtype= from the tensors it meets, or mark it '# {MARKER} <why it is safe>'",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
