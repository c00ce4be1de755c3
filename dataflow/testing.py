"""The one numeric comparison of the project: every backend against the numpy reference.

fp32 tolerances, stated once: |actual - expected| <= FP32_ATOL * scale + FP32_RTOL * |expected|,
with scale = max(1, max |expected|) so sums of many terms are judged relative to their size.
"""

from __future__ import annotations

import numpy as np

FP32_RTOL = 1e-4
FP32_ATOL = 1e-5


def _wide(x) -> np.ndarray:
    """float64, or complex128 for complex input (never drops an imaginary part)."""
    x = np.asarray(x)
    return x.astype(np.complex128 if np.iscomplexobj(x) else np.float64)


def max_abs_error(actual, expected) -> float:
    a, e = _wide(actual), _wide(expected)
    return float(np.max(np.abs(a - e))) if a.size else 0.0


def values_match(actual, expected, rtol: float = FP32_RTOL, atol: float = FP32_ATOL) -> bool:
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        return False
    scale = max(1.0, float(np.max(np.abs(e)))) if e.size else 1.0
    return bool(np.allclose(_wide(a), _wide(e), rtol=rtol, atol=atol * scale))


def assert_close(actual, expected, rtol: float = FP32_RTOL, atol: float = FP32_ATOL,
                 dtype=None) -> None:
    """Shape, then dtype (if given), then closeness with the stated tolerances."""
    a, e = np.asarray(actual), np.asarray(expected)
    assert a.shape == e.shape, f"shape {a.shape} != expected {e.shape}"
    if dtype is not None:
        assert a.dtype == np.dtype(dtype), f"dtype {a.dtype} != expected {np.dtype(dtype)}"
    assert values_match(a, e, rtol, atol), (
        f"values differ: max abs error {max_abs_error(a, e):.3g} (rtol={rtol}, atol={atol})")
