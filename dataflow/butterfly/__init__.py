"""Butterfly sparsity on the dataflow array (issue 4).

Public API (numpy references are the definition; `sim` runs the simulated array):

* `fft(x, backend="numpy"|"sim", arch=None, orchestration="multilayer")` — DFT along the last
  axis (power-of-two length), equal to `np.fft.fft` within fp32 tolerance.
* `butterfly_matmul(x, factors, backend=...)` — B x with B = F_(S-1) ... F_0; each factor
  an array (n/2, 2, 2), real or complex, indexed by pair number (see `reference`).
* `butterfly_linear(x, factors, bias)`, `butterfly_ffn(x, f1, f2, b1, b2)` (FABNet FFN),
  `fnet_attention(x)` (FNet/FABNet mixing Re(FFT2) over (seq, dim)).
* `monarch_matmul(x, l_blocks, r_blocks, backend=...)`, `block_butterfly_matmul(x, factors,
  block, backend=...)`: on `sim` each structured factor is one CSR SpMM program (Monarch's
  permutation folded into the second factor's column indices; `butterfly.structured`).
* `run_fft`, `run_butterfly_matmul`, `run_fnet_attention`, `run_spec`: the same on the engine,
  returning the `OrchestratedRun` / `SimResult` (cycles, stalls, SPM and DRAM traffic, spans).
* `reference`: numpy definitions — `fft_factors`, `bit_reverse_indices`, `butterfly_apply`,
  `butterfly_dense`, `random_factors`, `block_butterfly_apply`, `monarch_apply`,
  `butterfly_linear`, `butterfly_ffn`, `fnet_attention`, `twiddles`, `pair_indices`.

Lowering: `dataflow.dfg.lower_butterfly` (`ButterflySpec`, `StageGroup`, `lower_butterfly`,
`group_kernel`, `to_blocks`/`from_blocks`); orchestration: `dataflow.plan.orchestrate`
(`plan_orchestration`, `map_butterfly`, `roofline`); simulation: `butterfly.simulate`.
Orchestrations: `layer` (a DRAM round trip per stage), `fused` (f stages per kernel, values in
registers), `multilayer` (stage kernels co-resident, data between them in SPM lines).
"""

from dataflow.butterfly import reference
from dataflow.butterfly.ops import (
    BACKENDS,
    butterfly_ffn,
    butterfly_linear,
    butterfly_matmul,
    fft,
    fnet_attention,
    run_butterfly_matmul,
    run_fft,
    run_fnet_attention,
    run_spec,
)
from dataflow.butterfly.reference import ButterflyError
from dataflow.butterfly.simulate import OrchestratedRun, StageSpan, simulate_orchestrated
from dataflow.butterfly.structured import (
    block_butterfly_matmul,
    monarch_matmul,
    run_block_butterfly,
    run_monarch,
)
from dataflow.dfg.lower_butterfly import ButterflySpec, StageGroup
from dataflow.plan.orchestrate import ORCHESTRATIONS, FusionChoice

__all__ = [
    "BACKENDS", "ORCHESTRATIONS", "ButterflyError", "ButterflySpec", "FusionChoice",
    "OrchestratedRun", "StageGroup", "StageSpan", "block_butterfly_matmul", "butterfly_ffn",
    "butterfly_linear", "butterfly_matmul", "fft", "fnet_attention", "monarch_matmul", "reference",
    "run_block_butterfly", "run_butterfly_matmul", "run_fft", "run_fnet_attention", "run_monarch",
    "run_spec", "simulate_orchestrated",
]
