"""32 x 1 dynamic sparsity as a gathered-panel GEMM (docs/conventions.md#dynamic-panel-gemm).

A 32 x 1 micro-tile is a 32-row strip of one column of A, so C's 32-row panel tr is

    C[32 tr : 32 tr + 32, :] = sum over the kept strips c of A[32 tr : .., c] (outer) B[c, :]

a dense GEMM over the gathered K of that panel (PIT compacts the kept micro-tiles into a dense
tile the same way; docs/references.md#pit). The program:

1. `index_scan`: A is stored tile-major (each panel column-major: a strip's 32 words are four
   consecutive SPM rows, as a BLIS pack of 32-row panels), read once; each strip's sum of
   squares is accumulated in `PARTS` lane partials (`lower.index_scan_kernel` over A viewed as
   a tiles x 32 matrix of 1 x 32 tiles).
2. `index_compact`: each kept strip's column to its slot of `crd` (`lower.index_compact_kernel`;
   the slots' prefix sum is host-computed and streamed in, as there).
3. `panel_compact` (SRead): the kept strips gathered into `A_c`, strip p at words 32 p ..
   32 p + 31 (the DMA brings only the SPM rows the index selects, `fetch="gather"`).
4. `panel_gemm` (one kernel per N block of B): for each panel tr, row block ib of `BODY_ROWS`
   rows, vector j of C and kept strip p of the panel (a sparse loop over `tile_pos`):

       a = A_c[32 p + 8 ib : +8]            one SPM row (a column of the row block)
       b = B[crd[p], j]                     SRead of B's row
       C[32 tr + 8 ib + u, j] += a.lane(u) * b       u = 0 .. 7

   the dense GEMM's 8 x 1 outer-product body (`plan.gemm_schedule`), with B's row gathered: the
   compiler's generic search (`plan.compile.kernel_candidates`) fuses the products into maccs
   with accumulators in registers over p, blocks the vector loop (one A row feeding 16 or 32
   maccs) and tries copies sharing the PEs.

A split run (`dataflow.dynamic.split`) builds the index once per block of A's rows and columns:
the first N block's program runs steps 1-3 and writes `crd` and `A_c` to DRAM; later N blocks'
programs read them (`index_given`), so A crosses the DRAM interface once, not once per N block.
"""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.lower import (
    index_compact_kernel,
    index_scan_kernel,
    renamed,
    square_acc_nodes,
    zero_output_kernel,
)
from dataflow.dynamic.microtile import MicroTileIndex

#: rows of C per body: one SPM row of a kept strip (the lanes of the default and MLX arrays)
BODY_ROWS = 8
#: spare words of `crd` the zero strips' compaction writes go to (16 SPM rows of 8 words)
SPARE_SLOTS = 128


def most_kept(index: MicroTileIndex) -> int:
    """The most strips any panel keeps."""
    return int(np.diff(index.pos).max(initial=0))


def supported(tile: tuple[int, int]) -> bool:
    """Whether a micro-tile shape lowers as a gathered-panel GEMM: strips one column wide whose
    height is whole SPM rows."""
    bh, bw = tile
    return bw == 1 and bh % BODY_ROWS == 0


def pack_strips(a: np.ndarray, bh: int) -> np.ndarray:
    """A (m x k) tile-major: panel tr, column c, row e at word (tr * k + c) * bh + e."""
    m, k = a.shape
    return np.ascontiguousarray(a.reshape(m // bh, bh, k).transpose(0, 2, 1)).ravel()


def panel_compact_kernel(r0: int, r1: int, k: int, bh: int, pos: np.ndarray, p0: int, nnz: int,
                         a_buf: str, name: str) -> Kernel:
    """A_c[bh p + e] = A_t[((tr - r0 / bh) k + crd[p]) bh + e] for the kept strips p of the
    panels of rows r0 .. r1 (held in `a_buf`, tile-major), gathered in index order (PIT's SRead
    into a dense tile); `pos` those panels' offsets into `crd`, from `p0`."""
    nodes = (
        Node(0, Op.LOAD, buffer="crd", addr=Addr((("p", 1),), const=p0), name="crd"),
        Node(1, Op.GATHER, (0,), buffer=a_buf, addr=Addr((("tr", bh * k), ("e", 1)),
                                                          index_stride=bh), name="SRead A"),
        Node(2, Op.STORE, (1,), buffer="A_c", addr=Addr((("p", bh), ("e", 1)), const=p0 * bh),
             name="A_c="),
    )
    return Kernel(name=name,
                  loops=(Loop("tr", (r1 - r0) // bh), Loop("p", pos="tile_pos", parent="tr"),
                         Loop("e", bh)),
                  nodes=nodes,
                  buffers=(Buffer("crd", nnz + SPARE_SLOTS),
                           Buffer(a_buf, (r1 - r0) * k, fetch="gather"),
                           Buffer("A_c", nnz * bh, "output")),
                  vector_var="e", domain_arrays=(("tile_pos", np.asarray(pos, dtype=np.int64)),))


def panel_gemm_kernel(m: int, k: int, n: int, bh: int, pos: np.ndarray, nnz: int,
                      b_buf: str = "B", name: str = "panel_gemm", c_offset: int = 0,
                      c_size: int | None = None) -> Kernel:
    """C[bh tr + 8 ib + u, j] += A_c[bh p + 8 ib + u] * B[crd[p], j] over the kept strips p of
    panel tr (see the module docstring): load crd, gather B's row, load A_c's row, and per row u
    of the block a product of that row's lane with B's vector, accumulated. B (k x n) is one N
    block, whose m x n block of C starts at word `c_offset` of C (`c_size` words in all)."""
    nodes = [
        Node(0, Op.LOAD, buffer="crd", addr=Addr((("p", 1),)), name="crd"),
        Node(1, Op.GATHER, (0,), buffer=b_buf, addr=Addr((("j", 1),), index_stride=n),
             name="SRead B"),
        Node(2, Op.LOAD, buffer="A_c", addr=Addr((("p", bh), ("ib", BODY_ROWS)),
                                                 span=BODY_ROWS), name="A_c[row]"),
    ]
    carried = []
    for u in range(BODY_ROWS):
        mul, acc = len(nodes), len(nodes) + 1
        nodes += [Node(mul, Op.MUL, (2, 1), lane=u, name=f"a{u}*b"),
                  Node(acc, Op.ACC, (mul,), buffer="C",
                       addr=Addr((("tr", bh * n), ("ib", BODY_ROWS * n), ("j", 1)),
                                 const=c_offset + u * n), name=f"C{u}+=")]
        carried.append((acc, acc, 1))
    return Kernel(name=name,
                  loops=(Loop("tr", m // bh), Loop("ib", bh // BODY_ROWS), Loop("j", n),
                         Loop("p", pos="tile_pos", parent="tr")),
                  nodes=tuple(nodes),
                  buffers=(Buffer("crd", nnz + SPARE_SLOTS), Buffer(b_buf, k * n, fetch="gather"),
                           Buffer("A_c", max(1, nnz) * bh),
                           Buffer("C", m * n if c_size is None else c_size, "output")),
                  vector_var="j", carried=tuple(carried),
                  domain_arrays=(("tile_pos", np.asarray(pos, dtype=np.int64)),))


def n_blocks(n: int, block: int | None) -> list[tuple[int, int]]:
    """C's columns in blocks of `block` (all of them for None), the last taking the rest."""
    block = n if block is None else block
    return [(n0, min(n, n0 + block)) for n0 in range(0, n, block)]


#: words of slack per streamed window (row alignment and the mapper's extra row)
WINDOW_SLACK = 16


def _stream_words(bh: int, kept: int, cols: int) -> int:
    """SPM words one panel's streamed windows take double-buffered: its kept strips (A_c), their
    columns (crd) and `cols` columns of C."""
    return 2 * (bh * kept + kept + bh * cols + 3 * WINDOW_SLACK)


def fits_block(k: int, nb: int, bh: int, capacity_words: int, kept: int | None = None) -> bool:
    """Whether the program's kernels fit with a k x nb block of B, `kept` the most strips any
    panel keeps (k when unknown): the block (gathered, resident whole) in half the SPM (the
    other half takes the next block's prefetch), a panel's windows of A_c, crd and C in the
    other half, and a compaction group of one panel beside its compacted strips in half
    (`compaction_rows`)."""
    kept = k if kept is None else kept
    half = capacity_words // 2
    return (k * nb + SPARE_SLOTS + k <= half and _stream_words(bh, kept, nb) <= half
            and bh * k + _stream_words(bh, kept, 0) <= half)


def plan_n_block(k: int, n: int, bh: int, capacity_words: int, lanes: int,
                 kept: int | None = None) -> int | None:
    """Columns per N block of one program: None when all of B fits (`fits_block`), else the
    most whole pairs of SIMD vectors that fit, made even over the blocks; 0 when not even one
    pair fits (the run splits K too, `dataflow.dynamic.split`)."""
    if fits_block(k, n, bh, capacity_words, kept):
        return None
    align = 2 * lanes
    nb = next((c for c in range(n // align * align, 0, -align)
               if fits_block(k, c, bh, capacity_words, kept)), 0)
    if not nb:
        return 0
    count = -(-n // nb)
    even = -(-n // count)
    return min(nb, -(-even // align) * align)


def c_from_blocks(flat: np.ndarray, m: int, n: int, block: int | None) -> np.ndarray:
    """C (m x n) from its block-major layout: the m x nb block of each N block, one after
    another (`lower_panel_gemm`)."""
    flat = np.asarray(flat).ravel()
    out, at = np.empty((m, n), dtype=flat.dtype), 0
    for n0, n1 in n_blocks(n, block):
        out[:, n0:n1] = flat[at:at + m * (n1 - n0)].reshape(m, n1 - n0)
        at += m * (n1 - n0)
    return out


def compaction_rows(m: int, k: int, bh: int, capacity_words: int | None,
                    kept: int | None = None) -> int:
    """Rows of A per compaction kernel: the most whole panels whose strips (gathered, so
    resident whole) leave room for one panel's compacted strips double-buffered (`kept` of them,
    the most any panel keeps; k when unknown) in half the SPM; all of A without a capacity."""
    if capacity_words is None:
        return m
    room = capacity_words // 2 - _stream_words(bh, k if kept is None else kept, 0)
    return max(bh, min(m, room // (bh * k) * bh))


def lane_sum_scan_kernel(tiles: int, bh: int) -> Kernel:
    """norm[t] = sum of A_t[bh t + e] ** 2 over the strip's words: each SPM row's squares
    summed over its lanes (`Op.VSUM`) and accumulated over the strip's rows, one word per
    strip (for an array with a lane-sum unit; `lower.index_scan_kernel` keeps `PARTS` lane
    partials per strip instead)."""
    load = Node(0, Op.LOAD, buffer="A", addr=Addr((("t", bh), ("ib", BODY_ROWS), ("e", 1))),
                name="a")
    nodes = (*square_acc_nodes(load, "norm", Addr((("t", 1),)))[:3],
             Node(3, Op.VSUM, (2,), name="sum lanes"),
             Node(4, Op.ACC, (3,), buffer="norm", addr=Addr((("t", 1),)), name="norm+="))
    return Kernel(name="index_scan",
                  loops=(Loop("t", tiles), Loop("e", BODY_ROWS), Loop("ib", bh // BODY_ROWS)),
                  nodes=nodes, buffers=(Buffer("A", tiles * bh), Buffer("norm", tiles, "output")),
                  vector_var="e", carried=((4, 4, 1),))


def index_build_kernels(a: np.ndarray, index: MicroTileIndex, capacity_words: int | None,
                        dtype=np.float32, lane_sum: bool = False):
    """(kernels, inputs) of steps 1-3: the scan of the tile-major A, the compaction of the
    index and of the kept strips (one kernel per group of panels that fits, each reading its
    own copy of those rows, as `lower.compute_kernels` panels A)."""
    (m, k), (bh, _) = a.shape, index.tile
    tiles = index.tile_nonzero.size
    packed = np.asarray(pack_strips(a, bh), dtype=dtype)
    scan = (lane_sum_scan_kernel(tiles, bh) if lane_sum
            else renamed(index_scan_kernel(tiles, bh, (1, bh), "A"), {}, "index_scan"))
    # zero strips write spare slots past the kept ones, `SPARE_SLOTS` of them in turn: one
    # spare word would take most of the compaction's writes on one SPM line, one a cycle
    nnz = index.nnz_tiles
    slot = np.where(index.slot == nnz, nnz + np.arange(tiles) % SPARE_SLOTS, index.slot)
    kernels = [scan, index_compact_kernel(tiles, nnz + SPARE_SLOTS - 1)]
    inputs = [("A", packed), ("slot", slot),
              ("tile_col", np.tile(np.arange(k, dtype=np.int64), m // bh))]
    rows = compaction_rows(m, k, bh, capacity_words, most_kept(index))
    groups = [(r0, min(m, r0 + rows)) for r0 in range(0, m, rows)]
    for i, (r0, r1) in enumerate(groups):
        t0, t1 = r0 // bh, r1 // bh
        if index.pos[t1] == index.pos[t0]:
            continue
        buf = "A" if len(groups) == 1 else f"A_panel{i}"
        if buf != "A":
            inputs.append((buf, packed[r0 * k:r1 * k]))
        name = "panel_compact" if buf == "A" else f"panel_compact_{i}"
        kernels.append(panel_compact_kernel(r0, r1, k, bh, index.pos[t0:t1 + 1] - index.pos[t0],
                                            int(index.pos[t0]), nnz, buf, name))
    return kernels, inputs


def lower_panel_gemm(a: np.ndarray, b: np.ndarray, index: MicroTileIndex, dtype=np.float32,
                     index_given: bool = False, capacity_words: int | None = None,
                     n_block: int | None = None, lane_sum: bool = False) -> Program:
    """The program of C = A @ B (see the module docstring); `index_given`: `crd` and `A_c` are
    read from DRAM (made by an earlier block's program), not built. `n_block`: one GEMM kernel
    per block of that many columns of B and C (each B block an input of its own, so the DMA
    loads the next while a kernel computes, `dram.prefetch_next_kernel`), C stored block-major
    (`c_from_blocks` gives it back row-major); None: one kernel, C row-major. `lane_sum`: the
    scan sums each row's lanes (an array with a `vsum` unit), one norm word per strip."""
    (m, k), n = a.shape, b.shape[1]
    bh, bw = index.tile
    if not supported(index.tile):
        raise DFGError(f"panel GEMM lowering needs 1-column micro-tiles {BODY_ROWS}k rows high, "
                       f"got {bh} x {bw}")
    nnz = index.nnz_tiles
    crd = np.concatenate((index.crd, np.zeros(SPARE_SLOTS, dtype=np.int64)))
    if index_given:
        kernels = []
        strips = pack_strips(a, bh).reshape(-1, bh)
        a_c = strips[index.tile_id].ravel() if nnz else np.zeros(bh, dtype=dtype)
        inputs = [("crd", crd), ("A_c", np.asarray(a_c, dtype=dtype))]
    else:
        kernels, inputs = index_build_kernels(a, index, capacity_words, dtype, lane_sum)
    blocks = n_blocks(n, n_block)
    b = np.ascontiguousarray(b, dtype=dtype)
    if nnz:
        for i, (n0, n1) in enumerate(blocks):
            name = "panel_gemm" if len(blocks) == 1 else f"panel_gemm_{i}"
            buf = "B" if len(blocks) == 1 else f"B_{i}"
            kernels.append(panel_gemm_kernel(m, k, n1 - n0, bh, index.pos, nnz, buf, name,
                                             c_offset=m * n0, c_size=m * n))
            inputs.append((buf, np.ascontiguousarray(b[:, n0:n1]).ravel()))
    else:
        kernels.append(zero_output_kernel(m, n))
    prog = Program(
        name=f"dynamic_spmm_panel_{bh}x{bw}_{m}x{k}x{n}", kernels=tuple(kernels),
        inputs=tuple(inputs), outputs=(("C", (m, n)),), dtype=np.dtype(dtype).name,
        macs=int(np.count_nonzero(a)) * n,
        # the compacted index's values, which the host knows (its prefix sum is host-computed):
        # the compiler measures the GEMM kernels with them (`Program.known`)
        known=() if index_given else (("crd", crd),))
    return run_passes(prog)


__all__ = ["BODY_ROWS", "c_from_blocks", "lower_panel_gemm", "n_blocks", "pack_strips",
           "most_kept", "panel_compact_kernel", "panel_gemm_kernel", "plan_n_block",
           "supported"]
