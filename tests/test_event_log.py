"""Tiny hand-checkable timing: the whole per-cycle event log of a 1x2 @ 2x1 GEMM on 2x2 PEs.

Schedule (II = 1, one copy): loads of a and b issue at cycle 0 on PEs (0,0) and (0,1) and take
2 cycles (FU 1 + SPM access 1); b travels 2 hops to PE (1,0), so the mul issues at 4 and takes
2 cycles; a then hops once more to (1,1) where acc issues at 7. Iteration kk=1 follows one
cycle behind. The accumulator register sums both products before one SPM write: 1*3 + 2*4 = 11.
"""

import numpy as np

from dataflow.dfg.lower import lower_gemm
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import run_array
from tests.archs import variant


def test_event_log_of_a_two_iteration_gemm():
    arch = variant(**{"pe_array.rows": 2, "pe_array.cols": 2, "reconfiguration_cycles": 0})
    a = np.array([[1, 2]], np.float32)
    b = np.array([[3], [4]], np.float32)
    mapping = map_program(lower_gemm(a, b), arch, copies=1)
    (r,) = run_array(mapping, "reference", trace=True)
    assert r.trace == (
        (0, (0, 0), "load"), (0, (0, 1), "load"),
        (1, (0, 0), "load"), (1, (0, 1), "load"),
        (4, (1, 0), "mul"), (5, (1, 0), "mul"),
        (7, (1, 1), "acc"), (8, (1, 1), "acc"),
    )
    (tile,) = r.tiles
    assert tile.compute_cycles == 9  # (2 iterations - 1) * II + schedule length 8
    assert dict(r.outputs)["C"].tolist() == [11.0]
    assert r.spm_writes_per_line.sum() == 1  # one flush of the accumulator
