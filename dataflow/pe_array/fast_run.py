"""The fast engine's entry point: one mapped kernel run a tile at a time (`fast._run_tile`),
or, where the timing memo supplies a run of tiles, their values in one batched pass
(`fast_tile.run_tiles`, docs/architecture.md#batched-memo-hits). Its own module so that
`fast_tile`, which builds on the engine's pieces in `fast`, is not imported by them."""

from __future__ import annotations

import numpy as np

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import vector_nodes
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array import fast, fast_memo, fast_tile
from dataflow.pe_array.common import Counters, buffer_arrays, gather_fetch_words
from dataflow.pe_array.result import ArrayResult


def run_kernel_fast(km: KernelMapping, arch: ArchSpec, inputs: dict[str, np.ndarray],
                    dtype, memo: bool | None = None) -> ArrayResult:
    """Run one mapped kernel a tile at a time; cycles, SPM accesses per line, output values.

    `memo` (default: on unless the environment sets DATAFLOW_TILE_MEMO=0) reuses the timing of
    an earlier tile whose address pattern is the same up to a shift the SPM cannot tell apart
    (`_TimingMemo`); values are always computed."""
    kernel = km.kernel
    bufs = buffer_arrays(kernel, inputs, dtype)
    ctx = fast._Kernel(km=km, arch=arch, dtype=dtype,
                       lanes=arch.pe_array.simd_lanes if kernel.vector_var else 1,
                       vec=frozenset(vector_nodes(kernel)), times=fast._issue_times(km),
                       bufs=bufs,
                       # indirect-DMA words per gather-fetched input
                       fetched=gather_fetch_words(kernel, inputs, arch))
    fast._group_maccs(ctx)
    ct = Counters(arch)
    timing = None
    if fast_memo.tile_memo_enabled(memo):
        prior = fast_memo.RUNS.tiles_of(km, arch) if fast_memo.runs_memo_enabled() else None
        timing = fast_memo._TimingMemo(arch.spm, prior)
        if timing.prior is not None:
            timing.layouts = fast_memo.RUNS.layouts_of(timing.prior, kernel)
    if fast_tile.batch_applies(ctx, timing):  # memo hits' values in one pass (fast_tile.py)
        ct.tiles.extend(fast_tile.run_tiles(ctx, ct, timing))
    else:
        ct.tiles.extend(fast._run_tile(ctx, ct, ti, tile, timing)
                        for ti, tile in enumerate(km.tiles))
    return ct.result(kernel, bufs)
