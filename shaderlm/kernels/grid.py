"""Workgroup counts and sizes."""
from __future__ import annotations

ROW_WG = 256        # threads a workgroup of the row kernels (rmsnorm; quantize_q8 repeats its reduction)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_1d(dev, n_groups: int) -> tuple:
    """Spread n_groups workgroups over x (and y when x would pass the per-dimension limit)."""
    lim = dev.limit("max-compute-workgroups-per-dimension", 65535)
    if n_groups <= lim:
        return (max(n_groups, 1), 1, 1)
    return (lim, cdiv(n_groups, lim), 1)
