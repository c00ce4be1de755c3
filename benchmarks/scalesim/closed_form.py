"""Closed form of SCALE-Sim 3.0.0 compute cycles for a dense GEMM.

Pure Python, no dependencies: importable from the main environment (which
cannot import scalesim).  Verified to reproduce every record of
``tests/data/scalesim_golden.json`` exactly (see
``tests/test_scalesim_closed_form.py``).

Notation
--------
SCALE-Sim's GEMM convention (``scalesim/topology_utils.py:load_arrays_gemm``,
which turns row ``M, N, K`` into a conv layer with ifmap ``M x K``, filter
``1 x K`` and ``N`` filters): ifmap operand ``M x K``, filter operand ``K x N``,
ofmap ``M x N``.  The array has ``R`` rows (ArrayHeight) and ``C`` columns
(ArrayWidth).  Each dataflow maps two GEMM dimensions spatially -- ``Sr`` onto
array rows, ``Sc`` onto array columns -- and streams the third, ``T``, in time
(``set_params`` in each ``scalesim/compute/systolic_compute_<df>.py``):

====  ===========  ===========  ============  ==============================
df    Sr (rows)    Sc (cols)    T (time)      stationary operand
====  ===========  ===========  ============  ==============================
os    M            N            K             ofmap (partial sums)
ws    K            N            M             filter (weights)
is    K            M            N             ifmap (inputs)
====  ===========  ===========  ============  ==============================

Formula
-------
::

    folds      = ceil(Sr / R) * ceil(Sc / C)
    per_fold   = T + R + C - 2            (os)
               = T + 2R + C - 2           (ws, is)
    total      = folds * per_fold - 1

Where the terms come from
-------------------------
SCALE-Sim does not simulate PEs; it builds per-operand *demand matrices*, one
row per cycle, in ``create_{ifmap,filter,ofmap}_demand_mat``.  Every fold
(``for fc in range(col_fold): for fr in range(row_fold)``) contributes the
same number of rows to all three matrices, the folds are simply concatenated
(no overlap/pipelining between consecutive folds), and each fold is padded
with ``-1`` null requests to the full ``R x C`` array, so **a partial last
fold (in rows or columns) is charged exactly like a full one**.  The helper
``skew_matrix`` turns an ``L x W`` block into ``(L + W - 1) x W`` (column
``c`` delayed by ``c`` cycles), i.e. it adds ``W - 1`` cycles of skew.

* **os** (``systolic_compute_os.py``): ifmap demand per fold =
  ``T`` streamed K-elements + ``C - 1`` suffix ("allowing the generated outputs
  to drain out before starting the next fold") then skewed over the ``R`` array
  rows (+``R - 1``).  Equivalently from the ofmap side: ``T - 1`` null prefix
  (accumulating; no outputs ready) + ``R`` cycles to shift the ``R`` output
  rows out of the bottom edge, skewed over ``C`` columns (+``C - 1``).  Per
  fold: ``T + R + C - 2``.  Physically: fill skew of ``R - 1`` (rows) and
  ``C - 1`` (columns) + ``T`` MAC cycles; the output drain is folded into the
  same count (``T - 1 + R`` on the ofmap side), nothing extra is charged for
  loading a stationary operand because the stationary values are the outputs.
* **ws** (``systolic_compute_ws.py``) and **is** (``systolic_compute_is.py``):
  streaming-operand demand per fold = ``R`` prefix ("cycles for weights to
  load": shifting the stationary ``R x C`` tile into the array one row per
  cycle) + ``T`` streamed vectors + ``C - 1`` suffix ("cycles for final output
  to drain out") and then skewed over the ``R`` array rows (+``R - 1``).  The
  stationary-operand matrix is ``R`` rows of tile + ``R + C + T - 2`` null
  suffix; the ofmap matrix is ``2R - 1`` null prefix (``R`` preload + ``R - 1``
  reduction down the column) + ``T`` output rows skewed over ``C`` columns
  (+``C - 1``).  All three give ``2R + C + T - 2`` per fold: ``R`` preload of
  the stationary tile, ``R - 1`` fill skew across rows, ``T`` streaming
  cycles, ``C - 1`` drain/skew across columns.
* **The trailing ``- 1``**: ``double_buffered_scratchpad.service_memory_requests``
  sets ``total_cycles = max(ofmap_serviced_cycles)``, the 0-based cycle index
  of the last demand row (``i + stall_cycles``), so with ``L = folds *
  per_fold`` demand rows the reported figure is ``L - 1``.  This is the
  COMPUTE_REPORT "Total Cycles" column (``single_layer_sim.py``:
  ``memory_system.get_total_compute_cycles()``), not "Total Cycles (incl.
  prefetch)".

Stalls are assumed zero (``InterfaceBandwidth: CALC``, which is what the
golden file uses and what SCALE-Sim reports for all its records); with a user
bandwidth that stalls, SCALE-Sim adds the stall cycles on top.
"""

from __future__ import annotations

__all__ = [
    "scalesim_compute_cycles",
    "scalesim_cycles_per_fold",
    "scalesim_folds",
    "scalesim_mapping",
]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def scalesim_mapping(m: int, n: int, k: int, dataflow: str) -> tuple[int, int, int]:
    """Return ``(Sr, Sc, T)``: GEMM dims on array rows, array columns, and in time."""
    if dataflow == "os":
        return m, n, k
    if dataflow == "ws":
        return k, n, m
    if dataflow == "is":
        return k, m, n
    raise ValueError(f"unknown dataflow {dataflow!r} (expected 'os', 'ws' or 'is')")


def scalesim_folds(m: int, n: int, k: int, dataflow: str, rows: int = 32, cols: int = 32) -> int:
    """Number of folds ``ceil(Sr / rows) * ceil(Sc / cols)``."""
    sr, sc, _ = scalesim_mapping(m, n, k, dataflow)
    return _ceil_div(sr, rows) * _ceil_div(sc, cols)


def scalesim_cycles_per_fold(m: int, n: int, k: int, dataflow: str,
                             rows: int = 32, cols: int = 32) -> int:
    """Demand rows per fold: ``T+R+C-2`` (os) or ``T+2R+C-2`` (ws, is)."""
    _, _, t = scalesim_mapping(m, n, k, dataflow)
    if dataflow == "os":
        return t + rows + cols - 2
    return t + 2 * rows + cols - 2


def scalesim_compute_cycles(m: int, n: int, k: int, dataflow: str,
                            rows: int = 32, cols: int = 32) -> int:
    """SCALE-Sim 3.0.0 "Total Cycles" for GEMM (ifmap MxK, filter KxN) with no stalls.

    ``folds * per_fold - 1``; see the module docstring for the derivation.
    """
    for name, v in (("m", m), ("n", n), ("k", k), ("rows", rows), ("cols", cols)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    return (scalesim_folds(m, n, k, dataflow, rows, cols)
            * scalesim_cycles_per_fold(m, n, k, dataflow, rows, cols) - 1)
