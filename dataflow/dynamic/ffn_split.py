"""relu-ffn of any size (docs/conventions.md#relu-ffn-and-moe-of-any-size).

The FFN program (`dataflow.dynamic.ffn`) keeps W1 resident in its first GEMM and W2 beside a
panel of the hidden activations in its second layer; the tokens stream. Many tokens make the
second layer's panel, and the simulation's own arrays, outgrow the SPM and the host
(`--tokens 100000 --dim 1024 --hidden 4096` ran 52 s and took 4 GB before the mapper refused
it). So the tokens are cut into blocks -- whole micro-tile rows, as many as fit -- each a whole
FFN program of its own (GEMM, ReLU, run-time index, sparse second layer) that reads W1 and W2
again: the split's cost, above the whole problem's floor. Every block's Y is checked against
its float64 reference. A dense (`--granularity dense`) block's timing depends on its shape
alone and is memoised; a sparse block's depends on its activations, so every one is simulated.

Weights that do not fit even beside one micro-tile row of tokens -- W1 or W2 more than half the
SPM -- are one clear error up front (cutting the FFN's width would need K panels of its GEMMs,
which `--workload gemm` and `dynamic-spmm` do but this fused program does not), as is a run
over the split limits (`dataflow.plan.split.check_limits`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from collections.abc import Hashable

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.limits import HOST_BYTES_PER_ITERATION, MAX_KEPT_OUTPUT_BYTES
from dataflow.dynamic.lower import ROW_PAD
from dataflow.dynamic.microtile import GRANULARITIES, tile_nonzero_mask
from dataflow.errors import UserError
from dataflow.pe_array.result import SimResult
from dataflow.pe_array.roofline import floors
from dataflow.pe_array.simulate import sequence_results
from dataflow.plan.split import _groups, check_limits, fits_unsplit, largest, piece, round_up
from dataflow.testing import max_abs_error, values_match
from dataflow.workloads import check_host_memory, dense_bytes, fits_host_memory, host_budget


def host_bytes(tokens: int, dim: int, hidden: int) -> int:
    """Host bytes of the operands as `make_ffn_operands` counts them."""
    return 2 * dense_bytes((tokens, dim), (dim, hidden), (hidden, dim), (tokens, hidden),
                           (tokens, dim))


def sim_bytes(arch: ArchSpec, tokens: int, dim: int, hidden: int) -> float:
    """Host bytes the mapper and the engine hold to simulate `tokens` rows of the FFN: the
    GEMM's iterations (a vector of H per element of X), the ReLU's and the scan's (a vector of
    H each) and the second layer's (a vector of Y per hidden activation, counted dense: an
    upper bound), `HOST_BYTES_PER_ITERATION` each."""
    lanes = arch.pe_array.simd_lanes
    h_vec, y_vec = -(-hidden // lanes), -(-dim // lanes)
    return HOST_BYTES_PER_ITERATION * tokens * (dim * h_vec + 2 * h_vec + hidden * y_vec)


def _fits(arch: ArchSpec, granularity: str, tokens: int, dim: int, hidden: int) -> bool:
    """Whether `tokens` rows of the FFN map: W1 resident beside streamed rows of X and H, and
    the second layer's W2 beside all the tokens' hidden activations (its panel is every
    token, `compute_kernels(panel_rows=tokens)`; with 1 x bw micro-tiles Y too)."""
    row = arch.spm.words_per_row
    up_row = round_up(dim, row) + row + round_up(hidden, row) + row
    resident = round_up(tokens * (hidden + ROW_PAD), row) + round_up(hidden * dim, row)
    if GRANULARITIES.get(granularity, (2, 1))[0] == 1:
        resident += round_up(tokens * dim, row)
    return (fits_unsplit(arch, dim * hidden, up_row)
            and resident + 2 * up_row <= arch.spm.capacity_words)


def _key(xb: np.ndarray, w1: np.ndarray, b: np.ndarray, granularity: str) -> Hashable:
    """Blocks with equal keys run the same program up to values, so take the same cycles: the
    dense program's depends on its shape; a sparse one's also on which micro-tiles of its
    hidden activations are nonzero (the run-time index its kernels walk). With a dead neuron's
    whole column zero and 32 x 1 tiles, the blocks' indices are almost always equal."""
    if granularity == "dense":
        return (len(xb),)
    tile = GRANULARITIES[granularity]
    if len(xb) % tile[0]:
        return None
    hb = np.maximum(xb @ w1 + b, np.float32(0))
    pad = -hb.shape[1] % tile[1]
    nz = tile_nonzero_mask(np.pad(hb, ((0, 0), (0, pad))), tile)
    return (len(xb), hashlib.sha1(np.packbits(nz).tobytes()).hexdigest())


def plan_tokens(arch: ArchSpec, granularity: str, tokens: int, dim: int,
                hidden: int) -> int | None:
    """Tokens per block, or None when the whole FFN runs as before. A `UserError` naming the
    SPM when not even one micro-tile row of tokens fits beside the weights."""
    whole_host = fits_host_memory(host_bytes(tokens, dim, hidden)
                                  + sim_bytes(arch, tokens, dim, hidden))
    if whole_host and _fits(arch, granularity, tokens, dim, hidden):
        return None
    align = GRANULARITIES.get(granularity, (1, 1))[0]
    per_token = sim_bytes(arch, 1, dim, hidden)
    host_rows = int(max(0.0, host_budget() - host_bytes(tokens, dim, hidden)) // per_token)
    cap = min(tokens, host_rows) if not whole_host else tokens
    rows = largest(max(align, cap), align,
                   lambda t: _fits(arch, granularity, t, dim, hidden)) if cap >= 1 else None
    if rows is None:
        src = f" ({arch.source})" if arch.source else ""
        raise UserError(
            f"relu-ffn (--dim {dim} --hidden {hidden}) does not fit the SPM{src} even split "
            f"into token blocks: W1 and W2 ({dim * hidden:,} words each) must stay resident in "
            f"its {arch.spm.capacity_words:,} words beside {align} token row(s) of "
            f"{hidden + ROW_PAD:,} words; use a smaller --dim or --hidden, or "
            "--workload gemm / dynamic-spmm, which split K and N")
    return piece(tokens, -(-tokens // rows), align)


def split_relu_ffn(spec: ArchSpec, *, engine: str, seed: int, trace: bool, tokens: int,
                   dim: int, hidden: int, sparsity: float, granularity: str,
                   make_operands, simulate, reference) -> SimResult | None:
    """Run the FFN in token blocks when it does not fit whole (the module docstring); None
    when it does or a parameter is out of range (the whole run says which). `make_operands`,
    `simulate` and `reference` are `dataflow.dynamic.ffn`'s."""
    if min(tokens, dim, hidden) <= 0 or not 0.0 <= sparsity < 1.0:
        return None
    # the operands are held whole (not streamed): the host's limit comes first
    check_host_memory(f"relu-ffn operands (--tokens {tokens} --dim {dim} --hidden {hidden})",
                      host_bytes(tokens, dim, hidden))
    rows = plan_tokens(spec, granularity, tokens, dim, hidden)
    if rows is None:
        return None
    t0 = time.perf_counter()
    what = f"relu-ffn (--tokens {tokens} --dim {dim} --hidden {hidden})"
    if trace:
        raise UserError(f"--trace: {what} runs split into token blocks; trace a size that "
                        "fits whole")
    dense = granularity == "dense"
    # the first layer dense, the second on the live neurons (all of them when dense)
    per_token = dim * hidden * (2.0 if dense else 2.0 - sparsity)
    check_limits(what, tokens * per_token, 0)
    x, w1, b, w2 = make_operands(tokens, dim, hidden, sparsity, seed)
    keys = [_key(x[r0:r0 + rows], w1, b, granularity) for r0 in range(0, tokens, rows)]
    distinct = len({k for k in keys if k is not None}) + sum(k is None for k in keys)
    check_limits(what, 0, distinct * rows * per_token)  # one simulated block per key
    keep = tokens * dim * 4 <= MAX_KEPT_OUTPUT_BYTES
    output = np.zeros((tokens, dim), dtype=np.float32) if keep else None
    parts, memo = [], {}
    ok, error, useful, blocks, live = True, 0.0, 0, 0, 0
    for r0, key in zip(range(0, tokens, rows), keys):
        r1 = min(tokens, r0 + rows)
        xb = x[r0:r1]
        ref = reference(xb, w1, b, w2)
        if key is not None and key in memo:
            res = memo[key]
            out = ref
        else:
            res, stats = simulate(xb, w1, b, w2, granularity, spec, engine=engine)
            out = np.asarray(res.output, dtype=np.float32)
            res = dataclasses.replace(res, output=None)
            if key is not None:
                memo[key] = res
        hb = np.maximum(xb @ w1 + b, np.float32(0))
        live += int(np.count_nonzero(hb))
        useful += (r1 - r0) * dim * hidden + int(np.count_nonzero(hb)) * dim
        parts.append((key, None, res))
        ok = ok and values_match(out, ref)
        error = max(error, max_abs_error(out, ref))
        if output is not None:
            output[r0:r1] = out
        blocks += 1
    notes = (f"split (docs/conventions.md#relu-ffn-and-moe-of-any-size): {tokens:,} tokens cut "
             f"into {blocks:,} block(s) of {rows:,}, each a whole FFN program (W1 and W2 read "
             f"again per block), sizes from the SPM's {spec.spm.capacity_words:,} words and "
             "the host's memory",
             f"timing memoised: {len(memo):,} distinct block program(s) simulated, their "
             f"timing counted for all {blocks:,} (same shape and, sparse, same nonzero "
             "micro-tiles of the hidden activations: same cycles); the others' values are "
             "their numpy reference",
             f"hidden activations {1 - live / (tokens * hidden):.3f} sparse; values checked "
             f"block by block against a float64 numpy reference ({blocks:,} blocks)")
    res = sequence_results(_groups(parts), f"relu-ffn/{granularity}", output, notes=notes)
    read = tokens * dim + 2 * dim * hidden + hidden
    return dataclasses.replace(res, roofline=floors(spec, useful, read, tokens * dim),
                               values_match_reference=ok, max_abs_error=error,
                               wall_seconds=time.perf_counter() - t0)


__all__ = ["plan_tokens", "split_relu_ffn"]
