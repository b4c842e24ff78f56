"""When PEFT's ``(B @ A) * scaling`` may be computed as ``(B * scaling) @ A``: the same bits, one
pass less over a weight-sized tensor (B is out x r, the product out x in)."""

from __future__ import annotations

import math
from typing import Any


def fold_is_exact(weight_a: Any, weight_b: Any, scaling: Any) -> bool:
    """Whether ``(B * scaling) @ A`` has, bit for bit, the value of PEFT's ``(B @ A) * scaling``.

    Only for ``scaling = 2**k``, k >= 1: multiplying by it is exact and commutes with every rounding
    of the matmul (same kernel, same order of operations), unless a value overflows or is
    subnormal. Bounds taken from the small tensors rule both out. Overflow: no value of the folded
    matmul exceeds ``scaling * max|B| * max|A| * r`` by more than the roundings' growth (< 2).
    Subnormals: every product and partial sum is a multiple of ``ulp(min|A|) * ulp(min|B|)``, so a
    nonzero one is at least that, which must be normal (this also holds with flush-to-zero).
    Any other scaling (0.5: B * 0.5 can go subnormal), a zero, NaN or inf in A or B: ``False``."""
    import torch

    if (
        not isinstance(scaling, (int, float))
        or not 1 < scaling < math.inf
        or math.frexp(scaling)[0] != 0.5
        or weight_a.dim() != 2
        or weight_b.dim() != 2
        or weight_a.dtype != weight_b.dtype
    ):
        return False
    info, rank = torch.finfo(weight_a.dtype), weight_a.shape[0]
    if (rank + 1) * info.eps > 0.69:  # (1 + eps) ** (r + 1), the roundings' growth, may pass 2
        return False
    # A zero entry makes a minimum 0 and the answer False: rare in trained adapters (B is all zeros
    # before the first step only); finding the smallest nonzero entry instead took 5x as long.
    min_a, max_a, min_b, max_b = torch.stack(
        [*torch.aminmax(weight_a.abs()), *torch.aminmax(weight_b.abs())]
    ).tolist()  # one device sync; NaN compares False
    # ulp(x) >= x * eps / 2; `largest` bounds scaling, B * scaling and each partial sum alike
    largest = scaling * max(max_b, 1.0) * max(max_a * rank * 2, 1.0)
    return largest < info.max and min_a * min_b * info.eps * info.eps / 4 >= info.tiny
