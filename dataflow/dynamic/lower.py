"""Kernels of PIT-style dynamic sparsity (docs/references.md#pit): index build, SRead, SWrite.

C = A @ B where A (m x k) is sparse with a pattern known only at run time. The program:

1. `index_scan`: reads every element of A once and accumulates a * a per micro-tile (a tile is
   nonzero iff its sum is > 0) -- the run-time cost of finding the pattern, which PIT counts.
2. `index_compact` (and `index_compact_rows` for 1 x 64 tiles): writes each nonzero tile's
   column (and its row) to its slot of the compacted index (a SCATTER per tile).
   The slots are the exclusive prefix sum of the tile flags; that serial scan over the flags
   is computed on the host and streamed in (the DFG has no compare or scan op), so this kernel
   charges one load per tile for it.
3. compute, one kernel per panel of A's rows (panels keep the gathered operand within the SPM):
   - 32 x 1 and 32 x 64 (`tile_rows`): for each group of 32 rows, the nonzero tiles' columns
     of A and rows of B are gathered (SRead = `Op.GATHER`) into the dense inner loop. k is a
     reduction axis, which PIT permutes freely, so C's rows stay in place (accumulated in a
     register, written once).
   - 1 x 64 (`pit_scatter_kernel`, PIT's scheme): per k-block, the rows that hold a nonzero
     tile of it are gathered (SRead of A), multiplied by that block of B -- an affine load
     shared by every gathered row of the block and streamed per block -- and each partial row
     is added into its place in C (SWrite with accumulate = `Op.SCATTER_ACC`). The index for
     this kernel is compacted column-major (`pit_order`). `scheme="packed"` keeps the scheme
     used before the engines had SCATTER_ACC: rows gathered into a packed block G, each
     reducing over all its k-blocks (`row_gather`), then `swrite` overwrites C's rows
     (`Op.SCATTER`); B is gathered per tile there, not shared.

The compute kernels read the compacted index the `index_compact` kernel produced (the buffers
flow from kernel to kernel in the engine); the iteration domain (tiles per tile row) comes from
the host-built `MicroTileIndex`, as every sparse domain does (the mapper tiles with it).

DRAM: the gathered operands are `Buffer(fetch="gather")`: the DMA brings in only the SPM rows
(32-byte bursts) the index selects, counted from the real addresses
(`dataflow.pe_array.common.gather_fetch_words`), as PIT's SRead fetches only the nonzero
micro-tiles from memory (`fetch="whole"` gives the whole-panel DMA of the model before).

Modelling limits: a gathered buffer still occupies the SPM space of the whole panel (panels
are sized for it); the gather DMA streams at full bandwidth whatever its bursts' scatter (no
per-burst descriptor cost: optimistic for 32 x 1 tiles, whose 32 words touch 32 bursts); and
every kernel reads its inputs from DRAM, so A crosses the DRAM interface for the scan and
again for the gathers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, GemmShape, Kernel, Loop, Node, Program
from dataflow.dfg.lower import gemm_kernel, run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.microtile import (
    MicroTileIndex,
    build_index,
    check_shape,
    parse_granularity,
)

PARTS = 8  # partial sums per wide tile in the scan (one SIMD vector of contiguous words)


def square_acc_nodes(load: Node, acc_buffer: str, acc_addr: Addr) -> tuple[Node, ...]:
    """load a (twice: both loads read one SPM row in one cycle, which the line broadcasts, and
    two loads route more freely than one value fanned out to both inputs of a MUL);
    acc += a * a. A tile is nonzero iff its sum of squares is > 0: a sum of non-negative
    terms, so it is > 0 exactly when one a * a is (`microtile.tile_nonzero_mask` is the same
    test on the host)."""
    return (
        load,
        dataclasses.replace(load, id=1),
        Node(2, Op.MUL, (0, 1), name="a*a"),
        Node(3, Op.ACC, (2,), buffer=acc_buffer, addr=acc_addr, name="norm+="),
    )


def index_scan_kernel(m: int, k: int, tile: tuple[int, int], src: str = "A",
                      name: str = "index_scan", ld: int | None = None) -> Kernel:
    """norm[tile] (x PARTS for wide tiles) = sum of src * src over the tile; src is m x k,
    row-major with leading dimension `ld` (default k)."""
    ld = k if ld is None else ld
    bh, bw = tile
    tr, kt = m // bh, k // bw
    if bw == 1:  # 32 x 1: vector over the tile column, reduce down the 32 rows
        load = Node(0, Op.LOAD, buffer=src, addr=Addr((("tr", bh * ld), ("er", ld), ("tc", 1))),
                    name="a")
        nodes = square_acc_nodes(load, "norm", Addr((("tr", k), ("tc", 1))))
        loops = (Loop("tr", tr), Loop("tc", k), Loop("er", bh))
        size, vec = tr * k, "tc"
    else:
        if bw % PARTS:
            raise DFGError(f"{name}: tile width {bw} must be 1 or a multiple of {PARTS}")
        load = Node(0, Op.LOAD, buffer=src, addr=Addr(
            (("tr", bh * ld), ("tc", bw), ("er", ld), ("e8", PARTS), ("part", 1))), name="a")
        nodes = square_acc_nodes(load, "norm",
                                 Addr((("tr", kt * PARTS), ("tc", PARTS), ("part", 1))))
        loops = (Loop("tr", tr), Loop("tc", kt), Loop("part", PARTS), Loop("er", bh),
                 Loop("e8", bw // PARTS))
        size, vec = tr * kt * PARTS, "part"
    return Kernel(name=name, loops=loops, nodes=nodes,
                  buffers=(Buffer(src, m * ld), Buffer("norm", size, "output")),
                  vector_var=vec, carried=((3, 3, 1),))


def index_compact_kernel(tiles: int, nnz: int, source: str = "tile_col", target: str = "crd",
                         name: str = "index_compact") -> Kernel:
    """target[slot[t]] = source[t] for every tile t (zero tiles write the spare last slot):
    `crd` gets each nonzero tile's column; for 1 x bw tiles a second such kernel writes
    `tile_off` (the tile's first word in A) from `tile_offs`."""
    nodes = (
        Node(0, Op.LOAD, buffer="slot", addr=Addr((("t", 1),)), name="slot"),
        Node(1, Op.LOAD, buffer=source, addr=Addr((("t", 1),)), name=source),
        Node(2, Op.SCATTER, (0, 1), buffer=target, addr=Addr(index_stride=1),
             name=f"{target}[slot]="),
    )
    return Kernel(name=name, loops=(Loop("t", tiles),), nodes=nodes,
                  buffers=(Buffer("slot", tiles), Buffer(source, tiles),
                           Buffer(target, nnz + 1, "output")))


def tile_rows_kernel(rows: int, row0: int, m: int, k: int, n: int, tile: tuple[int, int],
                     pos: np.ndarray, crd_offset: int, nnz: int, a_buf: str,
                     name: str, ld: int | None = None, fetch: str = "gather") -> Kernel:
    """C[row0 + r, :] += sum over the nonzero tiles of r's tile row of A[r, tile] @ B[tile, :],
    for the `rows` rows of A held in `a_buf` (a panel starting at row `row0`, leading
    dimension `ld`, default k)."""
    ld = k if ld is None else ld
    bh, bw = tile
    ec = (("ec", 1),) if bw > 1 else ()
    nodes = (
        Node(0, Op.LOAD, buffer="crd", addr=Addr((("p", 1),), const=crd_offset), name="crd"),
        Node(1, Op.GATHER, (0,), buffer=a_buf,
             addr=Addr((("tr", bh * ld), ("er", ld), *ec), index_stride=bw), name="SRead A"),
        Node(2, Op.GATHER, (0,), buffer="B",
             addr=Addr(((("ec", n),) if bw > 1 else ()) + (("j", 1),), index_stride=bw * n),
             name="SRead B"),
        Node(3, Op.MUL, (1, 2), name="a*b"),
        Node(4, Op.ACC, (3,), buffer="C",
             addr=Addr((("tr", bh * n), ("er", n), ("j", 1)), const=row0 * n), name="C+="),
    )
    loops = (Loop("tr", rows // bh), Loop("er", bh), Loop("j", n),
             Loop("p", pos="tile_pos", parent="tr"))
    if bw > 1:
        loops += (Loop("ec", bw),)
    return Kernel(name=name, loops=loops, nodes=nodes,
                  buffers=(Buffer("crd", nnz + 1), Buffer(a_buf, rows * ld, fetch=fetch),
                           Buffer("B", k * n, fetch=fetch), Buffer("C", m * n, "output")),
                  vector_var="j", carried=((4, 4, 1),),
                  domain_arrays=(("tile_pos", np.asarray(pos, dtype=np.int64)),))


def row_gather_kernel(nrows: int, q0: int, row0: int, k: int, n: int, bw: int, qpos: np.ndarray,
                      crd_offset: int, nnz: int, total_rows: int, a_buf: str, a_rows: int,
                      name: str, ld: int | None = None, fetch: str = "gather") -> Kernel:
    """G[q0 + q, :] = sum over row q's nonzero 1 x bw tiles of A[row, tile] @ B[tile, :]: the
    `nrows` gathered rows of a panel of A starting at row `row0` (leading dimension `ld`)."""
    ld = k if ld is None else ld
    nodes = (
        Node(0, Op.LOAD, buffer="tile_off", addr=Addr((("p", 1),), const=crd_offset), name="tile"),
        # tile_off = row * ld + kb * bw: the tile's first word in A; the panel starts at row0
        Node(1, Op.GATHER, (0,), buffer=a_buf, addr=Addr((("ec", 1),), const=-row0 * ld,
                                                          index_stride=1), name="SRead A"),
        Node(2, Op.LOAD, buffer="crd", addr=Addr((("p", 1),), const=crd_offset), name="kb"),
        Node(3, Op.GATHER, (2,), buffer="B", addr=Addr((("ec", n), ("j", 1)), index_stride=bw * n),
             name="SRead B"),
        Node(4, Op.MUL, (1, 3), name="a*b"),
        Node(5, Op.ACC, (4,), buffer="G", addr=Addr((("q", n), ("j", 1)), const=q0 * n),
             name="G+="),
    )
    return Kernel(name=name,
                  loops=(Loop("q", nrows), Loop("j", n), Loop("p", pos="row_pos", parent="q"),
                         Loop("ec", bw)),
                  nodes=nodes,
                  buffers=(Buffer("tile_off", nnz + 1), Buffer(a_buf, a_rows * ld, fetch=fetch),
                           Buffer("crd", nnz + 1), Buffer("B", k * n, fetch=fetch),
                           Buffer("G", max(1, total_rows) * n, "output")),
                  vector_var="j", carried=((5, 5, 1),),
                  domain_arrays=(("row_pos", np.asarray(qpos, dtype=np.int64)),))


def pit_scatter_kernel(kblocks: int, row0: int, m: int, k: int, n: int, bw: int, cpos: np.ndarray,
                       crd_offset: int, nnz: int, a_buf: str, a_rows: int, name: str,
                       ld: int | None = None, fetch: str = "gather") -> Kernel:
    """PIT's 1 x bw kernel (docs/references.md#pit: SRead gathers the micro-tiles of one k-block
    into a dense tile, SWrite scatter-adds the partial results into C): for each k-block kb and
    each nonzero tile p of that block (rows of a panel starting at `row0`),
    C[row[p], :] += A[row[p], kb*bw : (kb+1)*bw] @ B[kb*bw : (kb+1)*bw, :].

    Every gathered row of a k-block shares that block of B, so B is an affine (streamed) load,
    not a gather; the partial row reduces over the tile's bw columns in the register and is
    added into C once per (tile, vector of C) by `Op.SCATTER_ACC`. The tiles arrive in
    column-major order within the panel (`cpos`: tiles per k-block), as the index compaction
    writes them for this kernel."""
    ld = k if ld is None else ld
    nodes = (
        # one index per tile, its row: the k-block is the outer loop's, so the tile's words in
        # A are row * ld + kb * bw + ec (the panel starts at row0) and its output row is row
        Node(0, Op.LOAD, buffer="tile_row", addr=Addr((("p", 1),), const=crd_offset), name="row"),
        Node(1, Op.GATHER, (0,), buffer=a_buf, addr=Addr((("kb", bw), ("ec", 1)), const=-row0 * ld,
                                                          index_stride=ld), name="SRead A"),
        Node(2, Op.LOAD, buffer="B", addr=Addr((("kb", bw * n), ("ec", n), ("j", 1))), name="B"),
        Node(3, Op.MUL, (1, 2), name="a*b"),
        Node(4, Op.SCATTER_ACC, (0, 3), buffer="C", addr=Addr((("j", 1),), index_stride=n),
             name="SWrite C+="),
    )
    return Kernel(name=name,
                  loops=(Loop("kb", kblocks), Loop("p", pos="col_pos", parent="kb"), Loop("j", n),
                         Loop("ec", bw)),
                  nodes=nodes,
                  buffers=(Buffer("tile_row", nnz + 1), Buffer(a_buf, a_rows * ld, fetch=fetch),
                           Buffer("B", k * n), Buffer("C", m * n, "output")),
                  vector_var="j", carried=((4, 4, 1),),
                  domain_arrays=(("col_pos", np.asarray(cpos, dtype=np.int64)),))


def pit_order(index: MicroTileIndex, panel_rows: int) -> np.ndarray:
    """Slot of every tile (row-major tile id) in the 1 x bw compacted index PIT's kernel reads:
    panel by panel, column-major (k-block, then row) within a panel; zero tiles get the spare
    last slot. Like `MicroTileIndex.slot`, the prefix sum is host-computed and streamed in."""
    kt = index.tile_nonzero.shape[1]
    t = index.tile_id
    r, c = t // kt, t % kt
    order = np.lexsort((r, c, r // panel_rows))
    slot = np.full(index.tile_nonzero.size, index.nnz_tiles, dtype=np.int64)
    slot[t[order]] = np.arange(len(t))
    return slot


def swrite_kernel(nrows: int, m: int, n: int, name: str = "swrite") -> Kernel:
    """C[rows[q], :] = G[q, :] (SWrite: gathered rows back to their places)."""
    nodes = (
        Node(0, Op.LOAD, buffer="rows", addr=Addr((("q", 1),)), name="row"),
        Node(1, Op.LOAD, buffer="G", addr=Addr((("q", n), ("j", 1))), name="g"),
        Node(2, Op.SCATTER, (0, 1), buffer="C", addr=Addr((("j", 1),), index_stride=n),
             name="SWrite C"),
    )
    return Kernel(name=name, loops=(Loop("q", nrows), Loop("j", n)), nodes=nodes,
                  buffers=(Buffer("rows", nrows), Buffer("G", nrows * n),
                           Buffer("C", m * n, "output")),
                  vector_var="j")


def renamed(kernel: Kernel, names: dict[str, str], name: str | None = None) -> Kernel:
    """`kernel` with its buffers renamed (to chain a library kernel into a larger program)."""
    nodes = tuple(dataclasses.replace(nd, buffer=names.get(nd.buffer, nd.buffer))
                  for nd in kernel.nodes)
    bufs = tuple(dataclasses.replace(b, name=names.get(b.name, b.name)) for b in kernel.buffers)
    return dataclasses.replace(kernel, nodes=nodes, buffers=bufs, name=name or kernel.name)


def panel_rows_for(m: int, k: int, n: int, bh: int, capacity_words: int,
                   ld: int | None = None) -> int:
    """Rows per panel of A: the most (a multiple of `bh`) whose panel plus B fill at most half
    the SPM, so the gathered (whole-resident) operands fit next to the streamed ones."""
    ld = k if ld is None else ld
    room = capacity_words // 2 - k * n
    if room < bh * ld:
        raise DFGError(f"B ({k} x {n} = {k * n} words) leaves no room for a {bh}-row panel of A "
                       f"in an SPM of {capacity_words} words; use a smaller --n or --k "
                       "(simulate_dynamic_matmul runs it in blocks that fit, "
                       "docs/conventions.md#tiling-any-problem-size)")
    return max(bh, min(m, (room // ld) // bh * bh))


def index_kernels(m: int, k: int, index: MicroTileIndex, src: str, with_tile_id: bool,
                  ld: int | None = None, panel_rows: int | None = None, scheme: str = "pit"):
    """(kernels, inputs) of the run-time index build over the m x k operand in buffer `src`
    (leading dimension `ld`). With `with_tile_id` (1 x bw tiles) a second compaction writes
    each nonzero tile's index for the compute kernel: with the "packed" scheme its first word
    in A (`tile_off`, the row gather's index); with "pit" its row (`tile_row`, the index of
    both SRead and SWrite), in `pit_order` (panels of `panel_rows` rows, column-major within
    one)."""
    ld = k if ld is None else ld
    check_scheme(scheme)
    bh, bw = index.tile
    tiles = index.tile_nonzero.size
    kt = k // bw
    kernels = (index_scan_kernel(m, k, index.tile, src, ld=ld),
               index_compact_kernel(tiles, index.nnz_tiles))
    inputs = [("slot", index.slot), ("tile_col", np.tile(np.arange(kt, dtype=np.int64), m // bh))]
    t = np.arange(tiles, dtype=np.int64)
    if with_tile_id and scheme == "packed":
        kernels += (index_compact_kernel(tiles, index.nnz_tiles, "tile_offs", "tile_off",
                                         "index_compact_ids"),)
        inputs.append(("tile_offs", (t // kt) * bh * ld + (t % kt) * bw))
    elif with_tile_id:
        kernels += (index_compact_kernel(tiles, index.nnz_tiles, "tile_rows", "tile_row",
                                         "index_compact_rows"),)
        inputs.append(("tile_rows", t // kt))
        inputs[0] = ("slot", pit_order(index, m if panel_rows is None else panel_rows))
    return kernels, inputs


SCHEMES = ("pit", "packed")


def check_scheme(scheme: str) -> None:
    if scheme not in SCHEMES:
        raise DFGError(f"1 x 64 scheme must be one of {SCHEMES}, got {scheme!r}")


def compute_kernels(a_name: str, a: np.ndarray, n: int, index: MicroTileIndex, panel_rows: int,
                    dtype, ld: int | None = None, scheme: str = "pit",
                    fetch: str = "gather") -> tuple[list[Kernel], list[tuple[str, np.ndarray]]]:
    """The compute (and, for 1 x bw tiles with the "packed" scheme, SWrite) kernels over panels
    of A's rows; `a` is m x k, held in buffer `a_name` with leading dimension `ld` (a single
    panel reads that buffer; several get copies of their rows). 1 x bw tiles: "pit"
    scatter-adds per k-block (`pit_scatter_kernel`, PIT's scheme); "packed" reduces each
    gathered row over all its k-blocks into a packed block G, then overwrites C's rows
    (`row_gather_kernel` + `swrite_kernel`, the scheme before the engines had SCATTER_ACC).
    `fetch`: how the gathered operands come from DRAM ("gather": only the SPM rows the index
    selects, PIT's SRead from memory; "whole": the whole panel, the model before indirect DMA)."""
    check_scheme(scheme)
    m, k = a.shape
    ld = k if ld is None else ld
    bh, bw = index.tile
    kernels: list[Kernel] = []
    inputs: list[tuple[str, np.ndarray]] = []
    panels = [(r0, min(m, r0 + panel_rows)) for r0 in range(0, m, panel_rows)]

    def panel_buffer(i, r0, r1):
        if len(panels) == 1:
            return a_name
        name = f"{a_name}_panel{i}"
        inputs.append((name, pad_rows(a[r0:r1], ld, dtype).ravel()))
        return name

    if bh > 1:
        for i, (r0, r1) in enumerate(panels):
            t0, t1 = r0 // bh, r1 // bh
            pos = index.pos[t0:t1 + 1] - index.pos[t0]
            kernels.append(tile_rows_kernel(r1 - r0, r0, m, k, n, index.tile, pos,
                                            int(index.pos[t0]), index.nnz_tiles,
                                            panel_buffer(i, r0, r1), f"sread_{i}", ld=ld,
                                            fetch=fetch))
        return kernels, inputs
    if scheme == "pit":
        kt = k // bw
        t = index.tile_id
        rows_of, cols_of = t // kt, t % kt
        offset = 0
        for i, (r0, r1) in enumerate(panels):
            mine = (rows_of >= r0) & (rows_of < r1)
            count = int(mine.sum())
            if not count:
                continue
            cpos = np.concatenate(([0], np.cumsum(np.bincount(cols_of[mine], minlength=kt))))
            kernels.append(pit_scatter_kernel(kt, r0, m, k, n, bw, cpos, offset, index.nnz_tiles,
                                              panel_buffer(i, r0, r1), r1 - r0, f"sread_{i}",
                                              ld=ld, fetch=fetch))
            offset += count
        return kernels, inputs
    counts = np.diff(index.pos)
    rows = np.flatnonzero(counts > 0).astype(np.int64)
    q = 0
    for i, (r0, r1) in enumerate(panels):
        mine = rows[(rows >= r0) & (rows < r1)]
        if not len(mine):
            continue
        qpos = np.concatenate(([index.pos[mine[0]]], index.pos[mine + 1])) - index.pos[mine[0]]
        kernels.append(row_gather_kernel(len(mine), q, r0, k, n, bw, qpos, int(index.pos[mine[0]]),
                                         index.nnz_tiles, len(rows), panel_buffer(i, r0, r1),
                                         r1 - r0, f"sread_{i}", ld=ld, fetch=fetch))
        q += len(mine)
    if len(rows):
        kernels.append(swrite_kernel(len(rows), m, n))
        inputs.append(("rows", rows))
    return kernels, inputs


def pad_rows(a: np.ndarray, ld: int, dtype=np.float32) -> np.ndarray:
    """`a` (m x k) stored with leading dimension ld >= k (zero padding at each row's end)."""
    out = np.zeros((a.shape[0], ld), dtype=dtype)
    out[:, :a.shape[1]] = a
    return out


ROW_PAD = 8  # words of padding per matrix row: one SPM row of the default arch (see below)


def lower_dynamic_spmm(a: np.ndarray, b: np.ndarray, granularity: str,
                       panel_rows: int | None = None, capacity_words: int | None = None,
                       dtype=np.float32, row_pad: int = ROW_PAD,
                       scheme: str = "pit", fetch: str = "gather"):
    """(Program, MicroTileIndex) of C = A @ B with A's pattern found at run time at
    `granularity` ("32x1", "1x64", "32x64"; `dataflow.dynamic.microtile.GRANULARITIES`).
    `panel_rows` (a multiple of the tile height) splits A's rows into panels; by default the
    largest panel that fits half of `capacity_words` next to B, or all rows.

    A is stored with `row_pad` zero words after each row (leading dimension k + row_pad): the
    copies of a kernel work on different rows of A at once, and with a power-of-two k every
    row would start on the same SPM line (interleaved mapping), serialising their reads on
    that line's ports; one SPM row of padding staggers the rows over the lines. The dense
    baseline (`lower_dense_reference`) stores A the same way."""

    tile = parse_granularity(granularity)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise DFGError(f"dynamic spmm needs A (m x k) and B (k x n); got {a.shape} and {b.shape}")
    (m, k), n = a.shape, b.shape[1]
    check_shape(m, k, tile, granularity)
    if panel_rows is None:
        panel_rows = (m if capacity_words is None
                      else panel_rows_for(m, k, n, tile[0], capacity_words, k + row_pad))
    if panel_rows <= 0 or panel_rows % tile[0]:
        raise DFGError(f"panel_rows must be a positive multiple of {tile[0]}, got {panel_rows}")
    a = np.ascontiguousarray(a, dtype=dtype)
    ld = k + row_pad
    index = build_index(a, tile)
    kernels, inputs = index_kernels(m, k, index, "A", with_tile_id=tile[0] == 1, ld=ld,
                                    panel_rows=panel_rows, scheme=scheme)
    ck, cin = compute_kernels("A", a, n, index, panel_rows, dtype, ld=ld, scheme=scheme,
                              fetch=fetch)
    kernels = tuple(kernels) + tuple(ck)
    if not ck:  # all-zero A: nothing to compute, C stays zero (a store-free program is empty)
        kernels += (zero_output_kernel(m, n),)
    prog = Program(
        name=f"dynamic_spmm_{granularity}_{m}x{k}x{n}", kernels=kernels,
        inputs=(("A", pad_rows(a, ld, dtype).ravel()),
                ("B", np.ascontiguousarray(b, dtype=dtype).ravel()),
                *inputs, *cin),
        outputs=(("C", (m, n)),), dtype=np.dtype(dtype).name,
        macs=int(np.count_nonzero(a)) * n,
    )
    return run_passes(prog), index


def zero_output_kernel(m: int, n: int) -> Kernel:
    """C = 0 * B[0, :] for every row: the output of an all-zero A, written once."""
    nodes = (Node(0, Op.CONST, value=0.0, name="0"),
             Node(1, Op.STORE, (0,), buffer="C", addr=Addr((("i", n), ("j", 1))), name="C="))
    return Kernel(name="zero_c", loops=(Loop("i", m), Loop("j", n)), nodes=nodes,
                  buffers=(Buffer("C", m * n, "output"),), vector_var="j")


def padded_gemm_kernel(m: int, k: int, n: int, ld: int, a: str = "A", b: str = "B", c: str = "C",
                       name: str = "gemm") -> Kernel:
    """`dataflow.dfg.lower.gemm_kernel` with A stored at leading dimension `ld`."""
    kern = renamed(gemm_kernel(m, k, n, name), {"A": a, "B": b, "C": c})
    nodes = (dataclasses.replace(kern.nodes[0], addr=Addr((("i", ld), ("kk", 1)))), *kern.nodes[1:])
    bufs = (Buffer(a, m * ld), *kern.buffers[1:])
    return dataclasses.replace(kern, nodes=nodes, buffers=bufs)


def lower_dense_reference(a: np.ndarray, b: np.ndarray, dtype=np.float32,
                          row_pad: int = ROW_PAD) -> Program:
    """The dense baseline: GEMM over the same (zero-filled) A, stored as the sparse kernels
    store it (leading dimension k + row_pad)."""
    (m, k), n = a.shape, b.shape[1]
    ld = k + row_pad
    return run_passes(Program(
        name=f"dense_{m}x{k}x{n}", kernels=(padded_gemm_kernel(m, k, n, ld),),
        inputs=(("A", pad_rows(a, ld, dtype).ravel()),
                ("B", np.ascontiguousarray(b, dtype=dtype).ravel())),
        outputs=(("C", (m, n)),), dtype=np.dtype(dtype).name, macs=m * k * n,
        gemm=GemmShape(m, n, k)))


__all__ = ["gemm_kernel", "index_compact_kernel", "index_scan_kernel", "lower_dynamic_spmm",
           "row_gather_kernel", "swrite_kernel", "tile_rows_kernel"]
