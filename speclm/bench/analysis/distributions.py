"""Percentiles and distributions (report.md's p50/p95/p99): linear interpolation
between order statistics (numpy's default)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """q-th percentile (0..100), linear interpolation; ValueError on no values."""
    xs = sorted(values)
    if not xs:
        raise ValueError("percentile of no values")
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def distribution(values: Iterable[float | None]) -> dict:
    """n, mean, min, q1 (p25), p50, q3 (p75), p95, p99, max of the non-None values."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return {"n": 0, "mean": None, "min": None, "q1": None, "p50": None, "q3": None,
                "p95": None, "p99": None, "max": None}
    return {"n": len(xs), "mean": sum(xs) / len(xs), "min": min(xs), "q1": percentile(xs, 25),
            "p50": percentile(xs, 50), "q3": percentile(xs, 75), "p95": percentile(xs, 95),
            "p99": percentile(xs, 99), "max": max(xs)}
