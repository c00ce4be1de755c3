"""A mixture-of-experts layer of any size (docs/conventions.md#relu-ffn-and-moe-of-any-size).

Gating and routing are per token, so the layer's rows are independent: when the dispatch's
gathered X (tokens x dim) or the combine's expert outputs (tokens x top_k x hidden) do not fit
the SPM, or the simulation's own arrays the host (`--tokens 100000` ran 14 s and took 700 MB
before the mapper refused its 6.4M-word X), the tokens are cut into blocks, each a whole MoE
layer of its own (gate, dispatch, experts, combine: `simulate_moe` on the block), run one after
another. Each block reads the gate and expert weights again: the split's cost, above the whole
layer's floor (its MACs, X and the weights read once, Y written once). Every block's values
are checked against the block's float64 reference. A block's timing depends on its routing
(rows per expert, gather order), so every block is simulated; the split limits
(`dataflow.plan.split.check_limits`) refuse up front a run that would take hours.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.limits import HOST_BYTES_PER_ITERATION, MAX_KEPT_OUTPUT_BYTES
from dataflow.pe_array.result import Roofline, SimResult
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import sequence_results
from dataflow.plan.split import check_limits, fits_spm, fits_unsplit, largest, piece, round_up
from dataflow.workloads import fits_host_memory, host_budget


def _gathered(tokens: int, dim: int, hidden: int, top_k: int) -> int:
    """Words of the largest gathered (so resident) buffer: X in the dispatch, the experts'
    outputs in the combine."""
    return tokens * max(dim, top_k * hidden)


def _row_words(arch: ArchSpec, dim: int, hidden: int) -> int:
    row = arch.spm.words_per_row
    return round_up(dim, row) + row + round_up(hidden, row) + row


def sim_bytes(arch: ArchSpec, tokens: int, dim: int, hidden: int, experts: int,
              top_k: int) -> float:
    """Host bytes the mapper and the engines hold to simulate `tokens` rows: the gate's and
    the experts' GEMM iterations (a vector of the output per element of X), the dispatch's and
    the combine's, `HOST_BYTES_PER_ITERATION` each."""
    lanes = arch.pe_array.simd_lanes
    per = dim * -(-experts // lanes) + top_k * (dim * -(-hidden // lanes) + 2 * -(-max(dim, hidden)
                                                                             // lanes))
    return HOST_BYTES_PER_ITERATION * tokens * per


def plan_tokens(arch: ArchSpec, experts: int, top_k: int, tokens: int, dim: int,
                hidden: int, operand_bytes: float) -> int | None:
    """Tokens per block, or None when the layer runs whole as before."""
    row_words = _row_words(arch, dim, hidden)
    host_ok = fits_host_memory(operand_bytes + sim_bytes(arch, tokens, dim, hidden, experts,
                                                         top_k))
    if host_ok and fits_unsplit(arch, _gathered(tokens, dim, hidden, top_k), row_words):
        return None
    per_token = sim_bytes(arch, 1, dim, hidden, experts, top_k)
    host_rows = max(1, int(max(0.0, host_budget() - operand_bytes) // per_token))
    rows = largest(min(tokens, host_rows), 1, lambda t: fits_spm(
        arch, _gathered(t, dim, hidden, top_k), row_words))
    rows = rows or 1  # one token's rows always fit; the mapper names the SPM if not
    return piece(tokens, -(-tokens // rows))


def split_moe(spec: ArchSpec, x, wg, bias, w, top_k: int, *, engine: str, placement: str,
              operand_bytes: float, simulate) -> SimResult | None:
    """Run the layer in token blocks when it does not fit whole (the module docstring); None
    when it does. `simulate` is `dataflow.moe.api.simulate_moe`."""
    (tokens, dim), (experts, _, hidden) = x.shape, w.shape
    rows = plan_tokens(spec, experts, top_k, tokens, dim, hidden, operand_bytes)
    if rows is None:
        return None
    t0 = time.perf_counter()
    macs = tokens * (dim * experts + top_k * (dim * hidden + hidden))
    check_limits(f"moe (--experts {experts} --top-k {top_k} --tokens {tokens} --dim {dim} "
                 f"--hidden {hidden})", macs, macs)
    keep = tokens * hidden * 4 <= MAX_KEPT_OUTPUT_BYTES
    output = np.zeros((tokens, hidden), dtype=np.float32) if keep else None
    parts, ok, error, per_expert = [], True, 0.0, np.zeros(experts, dtype=np.int64)
    for r0 in range(0, tokens, rows):
        r1 = min(tokens, r0 + rows)
        res, routing = simulate(x[r0:r1], wg, bias, w, top_k, spec, engine=engine,
                                placement=placement)
        ok = ok and bool(res.values_match_reference)
        error = max(error, res.max_abs_error or 0.0)
        per_expert += routing.tokens_per_expert
        if output is not None:
            output[r0:r1] = res.output
        parts.append(dataclasses.replace(res, output=None))
    busiest = int(np.argmax(per_expert))
    notes = (f"split (docs/conventions.md#relu-ffn-and-moe-of-any-size): {tokens:,} tokens "
             f"cut into {len(parts):,} block(s) of {rows:,}, each a whole MoE layer (gate "
             "and expert weights read again per block), every block simulated (its timing "
             f"depends on its routing); sizes from the SPM's {spec.spm.capacity_words:,} words "
             "and the host's memory",
             f"values checked block by block against a float64 numpy reference "
             f"({len(parts):,} blocks)",
             f"tokens per expert {per_expert.tolist()}; busiest expert{busiest}, "
             f"{per_expert.max() / per_expert.mean():.2f}x the mean")
    res = sequence_results(parts, "moe", output, notes=notes)
    whole = floors(spec, macs, tokens * dim + dim * experts + experts * dim * hidden,
                   tokens * hidden)
    roof = Roofline(whole.compute_cycles, whole.dram_cycles, whole.spm_port_cycles)
    return dataclasses.replace(res, roofline=roof, values_match_reference=ok,
                               max_abs_error=error, wall_seconds=time.perf_counter() - t0)


__all__ = ["plan_tokens", "split_moe"]
