"""tools/check_tensor_devices.py: no tensor trl_compat creates is built on the CPU by default (stack-free: ast only).

A patch tested on the CPU in float32 runs on CUDA in bf16: a device-less ``torch.zeros(n)`` combined
with CUDA tensors raises there. The check over the package, then the checker itself on snippets.
"""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("check_tensor_devices", os.path.join(ROOT, "tools", "check_tensor_devices.py"))
check = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check)


def problems(source, allowed=None):
    return [f.problem for f in check.check_source(source, allowed=allowed or {})]


def test_every_tensor_the_package_creates_takes_its_device_or_says_why_not():
    findings, stale = check.check_tree(root=ROOT)
    assert findings == [], "\n".join(map(str, findings))
    assert stale == []


def test_every_allow_list_entry_gives_its_reason():
    assert check.ALLOWED
    assert all(len(reason.split()) >= 5 for reason in check.ALLOWED.values())


def test_a_device_less_creation_is_reported():
    snippet = "import torch\n\ndef f(x):\n    return x + torch.zeros(3)\n"
    [finding] = check.check_source(snippet, allowed={})
    assert (finding.line, finding.call) == (4, "torch.zeros(3)")
    assert "no device=" in finding.problem


def test_every_creator_and_spelling_is_read():
    assert (
        problems("import torch\ntorch.arange(4)\ntorch.tensor([1.0])\ntorch.full((2,), 0.5)\ntorch.randperm(5)\n")
        == ["no device=: the tensor is built on the CPU whatever device the tensors it meets are on"] * 4
    )
    assert len(problems("import torch as th\nth.ones(2, dtype=th.float32)\n")) == 1
    assert len(problems("from torch import empty as e\ne(2)\n")) == 1
    assert len(problems("def f():\n    import torch\n    return torch.eye(2)\n")) == 1  # imported in the function
    assert "constant device" in problems("import torch\ntorch.tensor([1], device='cpu')\n")[0]
    assert "constant device" in problems("import torch\ntorch.arange(3, device=torch.device('cpu'))\n")[0]
    assert "takes no device" in problems("import torch\ntorch.LongTensor([1])\n")[0]
    assert "takes no device" in problems("import torch\ntorch.from_numpy(a)\n")[0]


def test_a_float32_default_beside_a_device_is_reported():
    assert "no dtype=" in problems("import torch\ntorch.zeros(3, device=x.device)\n")[0]
    # an integer range or a tensor of given values keeps its own dtype
    assert problems("import torch\ntorch.arange(3, device=x.device)\ntorch.tensor([1], device=x.device)\n") == []


def test_what_takes_its_device_from_a_tensor_is_not_reported():
    snippet = """
import torch
torch.zeros(3, device=x.device, dtype=x.dtype)
torch.full_like(x, float("nan"))
torch.ones_like(mask, dtype=torch.bool)
x.new_zeros(3)
torch.empty(n, **options)
torch.where(x > 0, x, 0.0)
numpy.zeros(3)
"""
    assert problems(snippet) == []


def test_a_marker_with_its_reason_resolves_a_finding_and_one_without_does_not():
    marked = "import torch\nindex = torch.arange(n)  # device-ok: indexes CPU copies only\n"
    above = "import torch\n# device-ok: a CPU generator, the same on every rank\nindex = torch.randperm(\n    n,\n)\n"
    assert problems(marked) == [] and problems(above) == []
    [problem] = problems("import torch\nindex = torch.arange(n)  # device-ok:\n")
    assert "gives no reason" in problem


def test_an_allow_list_entry_resolves_its_call_and_a_stale_one_is_reported(tmp_path):
    module = tmp_path / "pkg" / "m.py"
    module.parent.mkdir()
    module.write_text("import torch\nflag = torch.empty(0)\n")
    allowed = {("pkg/m.py", "torch.empty(0)"): "only its dtype is read, never combined with a tensor"}
    assert check.check_tree([str(module)], root=str(tmp_path), allowed=allowed) == ([], [])
    allowed[("pkg/m.py", "torch.zeros(1)")] = "a call that is no longer in the module"
    findings, stale = check.check_tree([str(module)], root=str(tmp_path), allowed=allowed)
    assert findings == [] and len(stale) == 1 and "torch.zeros(1)" in stale[0]


def test_adding_a_device_less_creation_to_a_patch_fails_the_check(tmp_path):
    """The check over the package fails the day a patch gains one."""
    path = os.path.join(ROOT, "trl_compat", "patches", "none_reward_baseline.py")
    with open(path, encoding="utf-8") as handle:
        source = handle.read()
    assert check.check_source(source, "trl_compat/patches/none_reward_baseline.py") == []
    broken = source + "\n\ndef baseline(rewards):\n    import torch\n\n    return rewards - torch.zeros(rewards.shape[0])\n"
    [finding] = check.check_source(broken, "trl_compat/patches/none_reward_baseline.py")
    assert finding.call == "torch.zeros(rewards.shape[0])"
    copy = tmp_path / "trl_compat" / "patches" / "none_reward_baseline.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(broken)
    assert check.main([str(copy)]) == 1
