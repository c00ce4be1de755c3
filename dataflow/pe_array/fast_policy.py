"""When the fast engine's folds and read counts run compiled (Numba) rather than in numpy: rent
or buy, as `systolic._use_numba` (docs/architecture.md#sharing-and-compiled-gathers). Shared
by `fast`, `fast_reads` and `fast_tile`, so none of them imports another for it."""

from __future__ import annotations

import os
import sys

import numpy as np

#: seconds numba's start-up costs a process that has not loaded it (`systolic.NUMBA_STARTUP_S`)
NUMBA_STARTUP_S = 0.9
#: seconds numpy's fold takes per element (2-core dev box: 2-6 ns; numba's loop: under 1 ns)
NUMPY_FOLD_S_PER_ELEMENT = 3e-9
#: once numba is loaded, folds of more elements than this run compiled
NUMPY_MAX_FOLD = 1 << 14
#: numpy seconds spent folding in this process; the environment variable DATAFLOW_FOLD_JIT=0
#: keeps every fold in numpy, =always compiles every float fold (tests compare the two)
fold_spent = {"numpy_s": 0.0}
FOLD_JIT_ENV = "DATAFLOW_FOLD_JIT"


def compiled_fold_pays(size: int, dtype, ragged: bool = False) -> bool:
    """Rent or buy, as `systolic._use_numba`: a float fold runs compiled once numba is loaded
    (above NUMPY_MAX_FOLD elements, or of runs of several lengths, which numpy folds one
    length at a time), or when numpy's time for it and the folds before would pass numba's
    start-up; never with DATAFLOW_FOLD_JIT=0, always with =always."""
    choice = os.environ.get(FOLD_JIT_ENV, "").strip().lower()
    if np.dtype(dtype).kind != "f" or choice in ("0", "false", "no", "off"):
        return False
    if choice == "always":
        return True
    if "numba" in sys.modules:
        return size > NUMPY_MAX_FOLD or ragged
    return fold_spent["numpy_s"] + size * NUMPY_FOLD_S_PER_ELEMENT > NUMBA_STARTUP_S
