"""Attention over a block-sparse mask as gathered GEMMs (docs/conventions.md#block-attention).

A BigBird mask is a set of whole b x b blocks (b a multiple of the 8 lanes): query panel tr
(rows b tr .. b tr + b - 1) attends the keys of its kept key blocks, whose block columns `bcrd`
(`bpos` per panel) the host knows (the pattern is static). The CSR lowering (`lower.py`) walks
the entries one gathered SPM row at a time; here every loaded row feeds eight or more maccs, as
the dense GEMM's 8 x 1 outer-product body (`plan.gemm_schedule`) and the gathered-panel GEMM of
`dataflow/dynamic/panel_gemm.py` (docs/conventions.md#dynamic-panel-gemm) do. Scores are kept
in *strip layout*: a kept key's scores against its panel's b query rows are b consecutive
words, so the query rows are the lanes and the softmax needs no lane reduction. Q and K are
stored as panels of their transposes (`pack_panels`, a host layout as `pack_strips`): block tr
of Q^T (d x b) at words tr d b .. (tr + 1) d b.

1. `sddmm`, over key blocks bj and the kept blocks q of that block column (CSC order, so K
   streams by blocks with affine addresses; a span load, one SPM row whose lanes are the
   operand, needs one; the blocks every panel keeps last, `key_block_order`, K packed in
   that order), query vector r and c < d:

       a_h = K_b[(bj d + c) b + 8 h : +8]              one SPM row: 8 keys at dimension c
       x   = Q_p[(brow[q] d + c) b + r]                the panel's query rows (gathered vector)
       St[(b q + 8 h + u) b + r] += a_h.lane(u) * x     u = 0 .. 7, h < b / 8, summed over c

2. `softmax_max`: rowmax[b tr + r] = max over the panel's kept strips (CSR order; each block's
   strips gathered from its CSC place `cidx`), elementwise over the query-row lanes.
3. `softmax_exp`: E = exp(scale (St - rowmax)), stored in CSR order (each panel's strips
   together); rowsum[b tr + r] += E (elementwise).
4. `spmm`: the gathered-panel GEMM (`panel_gemm_kernel`'s body) with A_c = E (strips of height
   b), B = V gathered by kept key (`kcrd`), every 8-row group g of the panel in one body (one
   gathered V row feeds b maccs), the softmax's normalisation folded as in
   docs/conventions.md#attention-fold: each E row is divided by its 8 query rows' sums as
   loaded (the division a kernel writing P would make, so the same values):
   O[b tr + 8 g + u, j] += (E / rowsum).lane(u) * V[kcrd[p], j].

The compiler's generic search (`plan.compile.kernel_candidates`) fuses the products into
maccs with accumulators in registers over the reduction and blocks the vector loop. The scores,
probabilities and row statistics are handed from kernel to kernel in the SPM when they fit
(`held_layout`). Without an accmax unit the row maximum is `strip_max_levels`. A mask that is
not whole blocks (a window) runs over the blocks it touches with `fill=True`, the fillers
masked by a -inf bias added to the scores in both softmax steps (`block_fill.py`;
docs/conventions.md#filler-blocks).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dataflow.attention.block_fill import (
    bias_buffers,
    biased,
    cover_structure,
    filler_bias,
    panel_blocks,
    touched_blocks,
)
from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.panel_gemm import BODY_ROWS, SPARE_SLOTS

#: the kernels of the block lowering, in program order (tests check these)
BLOCK_KERNELS = ("sddmm", "softmax_max", "softmax_exp", "spmm")
#: block edges tried, largest first (a larger block: fewer kept blocks, longer strips)
BLOCK_EDGES = (64, 32, 16, 8)


def block_structure(pos: np.ndarray, crd: np.ndarray, m: int, n: int, edge: int,
                    lanes: int = BODY_ROWS) -> tuple[np.ndarray, np.ndarray] | None:
    """(bpos, bcrd): the kept edge x edge blocks of the CSR mask (m x n) per query panel, when
    the mask is exactly whole aligned blocks and edge is a multiple of `lanes` dividing m and
    n; else None."""
    got = touched_blocks(pos, crd, m, n, edge, lanes)
    # csr has no repeats, so a full block has edge^2 entries
    if got is None or (got[2] != edge * edge).any():
        return None
    return panel_blocks(got[0], got[1], m // edge)


def find_blocks(pos: np.ndarray, crd: np.ndarray, m: int, n: int, lanes: int = BODY_ROWS):
    """(edge, bpos, bcrd) for the largest block edge (`BLOCK_EDGES`) the mask is whole blocks
    of, or None."""
    for edge in BLOCK_EDGES:
        got = block_structure(pos, crd, m, n, edge, lanes)
        if got is not None:
            return (edge, *got)
    return None


def pack_panels(q: np.ndarray, bh: int, dtype=np.float32) -> np.ndarray:
    """Q (m x d) panel-packed: panel tr's Q^T (d x bh) at words tr d bh .. (tr + 1) d bh, so a
    tile of panels is one contiguous window (Q^T whole would be strided by m)."""
    m, d = q.shape
    return np.ascontiguousarray(q.reshape(m // bh, bh, d).transpose(0, 2, 1),
                                dtype=dtype).ravel()


def key_block_order(bcrd: np.ndarray, panels: int, nbj: int) -> np.ndarray:
    """The key blocks in the order the `sddmm` streams them: those every query panel keeps
    (BigBird's global key blocks) last, the others in key order. A global block is the
    heaviest column of the scores (every panel's Q gathered), so the kernel's last tile is
    long and the DMA's load of V (`_early_v`, issued once the scores' last load has landed,
    `pe_array.system.run_system`) hides behind it (docs/conventions.md#block-attention)."""
    counts = np.bincount(np.asarray(bcrd, dtype=np.int64), minlength=nbj)
    full = counts >= panels
    keys = np.arange(nbj, dtype=np.int64)
    return np.concatenate((keys[~full], keys[full]))


def block_sddmm_kernel(m: int, n: int, d: int, bh: int, cpos: np.ndarray) -> Kernel:
    """St[(bh q + 8 h + u) bh + r] = sum_c K_b[(bj d + c) bh + 8 h + u] * Q_p[(tr d + c) bh + r]
    for every key block bj and the kept blocks q of its column (CSC order, `cpos`), tr =
    brow[q] the block's panel: the 8 x 1 outer product of one K_b row (8 keys, span) and a
    vector of the panel's query rows (gathered through brow), accumulated over c, both 8-key
    rows of the block in one body (module docstring, step 1). K streams by key blocks (affine);
    Q is gathered, resident whole."""
    blocks = int(cpos[-1])
    nodes = [Node(0, Op.LOAD, buffer="brow", addr=Addr((("q", 1),)), name="panel"),
             Node(1, Op.GATHER, (0,), buffer="Q_p",
                  addr=Addr((("c", bh), ("r", 1)), index_stride=d * bh), name="Q^T")]
    carried = []
    for h in range(bh // BODY_ROWS):
        k_row = len(nodes)
        nodes.append(Node(k_row, Op.LOAD, buffer="K_b",
                          addr=Addr((("bj", d * bh), ("c", bh)), const=BODY_ROWS * h,
                                    span=BODY_ROWS), name=f"K^T[{h}]"))
        for u in range(BODY_ROWS):
            mul, acc = len(nodes), len(nodes) + 1
            key = BODY_ROWS * h + u
            nodes += [Node(mul, Op.MUL, (k_row, 1), lane=u, name=f"k{key}*q"),
                      Node(acc, Op.ACC, (mul,), buffer="St",
                           addr=Addr((("q", bh * bh), ("r", 1)), const=key * bh),
                           name=f"St{key}+=")]
            carried.append((acc, acc, 1))
    return Kernel(name="sddmm",
                  loops=(Loop("bj", n // bh), Loop("q", pos="col_pos", parent="bj"),
                         Loop("r", bh), Loop("c", d)),
                  nodes=tuple(nodes),
                  buffers=(Buffer("brow", blocks), Buffer("Q_p", d * m), Buffer("K_b", n * d),
                           Buffer("St", blocks * bh * bh, "output")),
                  vector_var="r", carried=tuple(carried),
                  domain_arrays=(("col_pos", np.asarray(cpos, dtype=np.int64)),))


def _strip_kernel(name: str, m: int, bh: int, bpos: np.ndarray, nodes, buffers,
                  carried) -> Kernel:
    """A kernel over (panel tr, query vector r, kept block p, key k of the block): one
    iteration per strip row, the query rows in lanes; the row statistics (rowmax, rowsum at
    bh tr + r) do not move with p and k, so they accumulate in registers."""
    return Kernel(name=name,
                  loops=(Loop("tr", m // bh), Loop("r", bh),
                         Loop("p", pos="tile_pos", parent="tr"), Loop("k", bh)),
                  nodes=tuple(nodes), buffers=tuple(buffers), vector_var="r",
                  carried=carried,
                  domain_arrays=(("tile_pos", np.asarray(bpos, dtype=np.int64)),))


def strip_softmax_kernels(m: int, bh: int, bpos: np.ndarray, scale: float, bias: int = 0):
    """`softmax_max` and `softmax_exp` over the strips of each panel (module docstring, steps
    2-3): the scores gathered from their CSC place (`cidx`, one SPM row per gather), the
    probabilities E stored in CSR order (each panel's strips together, for the PV). `bias`:
    the words of the fillers' bias table (`block_fill.py`; 0: none), gathered through each
    block's pattern (`bpat`, CSR order) and added to the scores."""
    blocks = int(bpos[-1])
    size = blocks * bh * bh
    st = Addr((("p", bh * bh), ("k", bh), ("r", 1)))
    row = Addr((("tr", bh), ("r", 1)))
    gaddr = Addr((("k", bh), ("r", 1)), index_stride=bh * bh)

    def scores():
        nodes = [Node(0, Op.LOAD, buffer="cidx", addr=Addr((("p", 1),)), name="csc[p]"),
                 Node(1, Op.GATHER, (0,), buffer="St", addr=gaddr, name="s")]
        if not bias:
            return nodes, 1
        nodes.append(Node(2, Op.LOAD, buffer="bpat", addr=Addr((("p", 1),)), name="pat[p]"))
        return nodes, biased(nodes, 1, 2, gaddr)

    extra = bias_buffers(bias, blocks, "bpat") if bias else []
    nodes, s_ = scores()
    mx = len(nodes)
    nodes.append(Node(mx, Op.ACC_MAX, (s_,), buffer="rowmax", addr=row, name="max="))
    smax = _strip_kernel(
        "softmax_max", m, bh, bpos, nodes,
        [Buffer("cidx", blocks), Buffer("St", size), *extra,
         Buffer("rowmax", m, "output", init=-math.inf)], ((mx, mx, 1),))
    nodes, s_ = scores()
    i = len(nodes)
    nodes += [Node(i, Op.LOAD, buffer="rowmax", addr=row, name="max"),
              Node(i + 1, Op.SUB, (s_, i), name="s-max"),
              Node(i + 2, Op.CONST, value=scale, name="1/sqrt(d)"),
              Node(i + 3, Op.MUL, (i + 1, i + 2), name="*scale"),
              Node(i + 4, Op.EXP, (i + 3,), name="exp"),
              Node(i + 5, Op.STORE, (i + 4,), buffer="E", addr=st, name="E="),
              Node(i + 6, Op.ACC, (i + 4,), buffer="rowsum", addr=row, name="sum+=")]
    sexp = _strip_kernel(
        "softmax_exp", m, bh, bpos, nodes,
        [Buffer("cidx", blocks), Buffer("St", size), *extra, Buffer("rowmax", m),
         Buffer("E", size, "output"), Buffer("rowsum", m, "output")], ((i + 6, i + 6, 1),))
    return smax, sexp


#: items one level of the accmax-free strip maximum reduces to one (`strip_max_levels`)
LEVEL_WIDTH = 8


def strip_max_levels(m: int, bh: int, bpos: np.ndarray, cidx: np.ndarray, bias: int = 0):
    """(kernels, inputs): the strips' row maximum without an accmax unit (the MLX preset;
    docs/conventions.md#block-attention), from loads, gathers, `max` and stores. Level 0
    (`softmax_max`) takes each kept block's maximum over its bh key strips (affine: a block's
    strips are consecutive; blocks in the scores' CSC order); each next level
    (`softmax_max_<l>`) gathers `LEVEL_WIDTH` items of a panel (the last chunk padded by
    repeating the panel's last item: max is idempotent) into one, until every panel has one
    item, which the last level writes to rowmax[bh tr + r]. The maximum is exact, so the
    values equal the accmax's."""
    row = Addr((("o", bh), ("r", 1)))
    nodes = [Node(k, Op.LOAD, buffer="St", addr=Addr((("o", bh * bh), ("r", 1)), const=k * bh),
                  name=f"s{k}") for k in range(bh)]
    leaves = list(nodes)
    if bias:  # the fillers' bias (`block_fill.py`), the blocks' patterns in CSC order
        nodes.append(Node(bh, Op.LOAD, buffer="bpat_c", addr=Addr((("o", 1),)), name="pat[o]"))
        leaves = [nodes[biased(nodes, k, bh, Addr((("r", 1),), const=k * bh,
                                                  index_stride=bh * bh))] for k in range(bh)]
    nodes += _max_tree(leaves, start=len(nodes))
    counts = np.diff(bpos)
    items = int(bpos[-1])
    final = False  # level 0's blocks are in CSC order: at least one gather level
    out_buf, out_size = "BM0", items * bh
    nodes.append(Node(len(nodes), Op.STORE, (nodes[-1].id,), buffer=out_buf, addr=row,
                      name=f"{out_buf}="))
    kernels = [Kernel(name="softmax_max", loops=(Loop("o", items), Loop("r", bh)),
                      nodes=tuple(nodes),
                      buffers=(Buffer("St", items * bh * bh),
                               *(bias_buffers(bias, items, "bpat_c") if bias else []),
                               Buffer(out_buf, out_size, "output", init=-math.inf)),
                      vector_var="r")]
    inputs = []
    level, src = 0, "BM0"
    while not final:
        level += 1
        chunks = -(-counts // LEVEL_WIDTH)
        starts = np.concatenate(([0], np.cumsum(counts)))
        idx = np.concatenate([
            np.minimum(np.arange(c * LEVEL_WIDTH), n - 1) + s0
            for c, n, s0 in zip(chunks, counts, starts[:-1])]).astype(np.int64)
        if level == 1:  # CSR block -> its CSC item
            idx = np.asarray(cidx, dtype=np.int64)[idx]
        final = bool((chunks == 1).all())
        dst = "rowmax" if final else f"BM{level}"
        total = int(chunks.sum())
        nodes = []
        for w in range(LEVEL_WIDTH):
            nodes += [Node(2 * w, Op.LOAD, buffer=f"max_idx{level}",
                           addr=Addr((("o", LEVEL_WIDTH),), const=w), name=f"i{w}"),
                      Node(2 * w + 1, Op.GATHER, (2 * w,), buffer=src,
                           addr=Addr((("r", 1),), index_stride=bh), name=f"g{w}")]
        nodes += _max_tree([nodes[2 * w + 1] for w in range(LEVEL_WIDTH)], start=len(nodes))
        nodes.append(Node(len(nodes), Op.STORE, (nodes[-1].id,), buffer=dst, addr=row,
                          name=f"{dst}="))
        kernels.append(Kernel(
            name=f"softmax_max_{level}", loops=(Loop("o", total), Loop("r", bh)),
            nodes=tuple(nodes),
            buffers=(Buffer(f"max_idx{level}", len(idx)), Buffer(src, int(counts.sum()) * bh),
                     Buffer(dst, m if final else total * bh, "output", init=-math.inf)),
            vector_var="r"))
        inputs.append((f"max_idx{level}", idx))
        counts, src = chunks, dst
    return kernels, inputs


def _max_tree(leaves, start: int | None = None):
    """`max` nodes reducing `leaves` pairwise, ids from `start` (after the leaves); the last
    node is the maximum."""
    nid = (max(n.id for n in leaves) + 1) if start is None else start
    level, out = list(leaves), []
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            nd = Node(nid, Op.MAX, (a.id, b.id), name="max")
            out.append(nd)
            nxt.append(nd)
            nid += 1
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return out


def normalised_pv_kernel(m: int, n: int, dv: int, bh: int, kpos: np.ndarray) -> Kernel:
    """O[bh tr + 8 g + u, j] += (E[bh p + 8 g + u] / rowsum[bh tr + 8 g + u]) * V[kcrd[p], j]
    over the kept keys p of panel tr: `panel_gemm_kernel`'s body with every 8-row group g of
    the panel in one body, so each gathered row of V feeds bh maccs (module docstring, step
    5); each E row is divided by its query rows' sums as loaded (the sums are held: they do
    not move with p)."""
    keys = int(kpos[-1])
    nodes = [
        Node(0, Op.LOAD, buffer="kcrd", addr=Addr((("p", 1),)), name="kcrd"),
        Node(1, Op.GATHER, (0,), buffer="V", addr=Addr((("j", 1),), index_stride=dv),
             name="SRead V"),
    ]
    carried = []
    for g in range(bh // BODY_ROWS):
        e, s, div = len(nodes), len(nodes) + 1, len(nodes) + 2
        nodes += [Node(e, Op.LOAD, buffer="E", addr=Addr((("p", bh),), const=BODY_ROWS * g,
                                                         span=BODY_ROWS), name=f"E[{g}]"),
                  Node(s, Op.LOAD, buffer="rowsum", addr=Addr((("tr", bh),),
                                                              const=BODY_ROWS * g,
                                                              span=BODY_ROWS), name=f"sum[{g}]"),
                  Node(div, Op.DIV, (e, s), name=f"P[{g}]")]
        for u in range(BODY_ROWS):
            mul, acc = len(nodes), len(nodes) + 1
            row = BODY_ROWS * g + u
            nodes += [Node(mul, Op.MUL, (div, 1), lane=u, name=f"p{row}*v"),
                      Node(acc, Op.ACC, (mul,), buffer="O",
                           addr=Addr((("tr", bh * dv), ("j", 1)), const=row * dv),
                           name=f"O{row}+=")]
            carried.append((acc, acc, 1))
    return Kernel(name="spmm",
                  loops=(Loop("tr", m // bh), Loop("j", dv),
                         Loop("p", pos="tile_pos", parent="tr")),
                  nodes=tuple(nodes),
                  buffers=(Buffer("kcrd", keys + SPARE_SLOTS), Buffer("V", n * dv, fetch="gather"),
                           Buffer("E", keys * bh), Buffer("rowsum", m),
                           Buffer("O", m * dv, "output")),
                  vector_var="j", carried=tuple(carried),
                  domain_arrays=(("tile_pos", np.asarray(kpos, dtype=np.int64)),))


#: SPM word alignment of the buffers handed over on chip (a whole row of every line)
HELD_ALIGN = 128


def held_align(words: int) -> int:
    """`words` rounded up to a held buffer's alignment (`HELD_ALIGN`)."""
    return -(-words // HELD_ALIGN) * HELD_ALIGN


def held_layout(m: int, bh: int, blocks: int,
                q_words: int | None = None) -> dict[str, tuple[int, int]]:
    """(size, spm_base) of each buffer handed from kernel to kernel in the SPM
    (docs/conventions.md#moe-buffers-handed-over-in-the-spm): the probabilities E
    (softmax_exp -> spmm) and the row sums from word 0, so the spmm's held words are one run
    from the bottom; the row maxima, then the scores St (sddmm -> both softmax kernels).
    `q_words` (no accmax unit, where V is not loaded early): the sddmm's Q_p held from word
    0 too (below St, where E and the sums go once it is dead), St and the row maxima above
    the larger of the two, so no kernel leaves a gap under its held words."""
    st = blocks * bh * bh
    out = {"E": (st, 0), "rowsum": (m, held_align(st))}
    if q_words is not None:
        out["Q_p"] = (q_words, 0)
        base = held_align(max(q_words, held_align(st) + m))
        out["St"] = (st, base)
        out["rowmax"] = (m, held_align(base + st))
        return out
    out["rowmax"] = (m, held_align(held_align(st) + m))
    out["St"] = (st, held_align(held_align(held_align(st) + m) + m))
    return out


def held_words(m: int, bh: int, blocks: int, q_words: int | None = None) -> int:
    """The SPM words the held buffers span (`held_layout`)."""
    lay = held_layout(m, bh, blocks, q_words)
    return max(base + size for size, base in lay.values())


def hold_on_chip(kernel: Kernel, layout: dict[str, tuple[int, int]]) -> Kernel:
    """The kernel with its buffers of `layout` held on chip at their words."""
    bufs = tuple(dataclasses.replace(b, fetch="on_chip", spm_base=layout[b.name][1])
                 if b.name in layout else b for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=bufs)


def _early_v(kernels: tuple[Kernel, ...], size: int, base: int) -> tuple[Kernel, ...]:
    """V loaded whole by `softmax_max` (fetch "keep") and left in the SPM through
    `softmax_exp` to the PV ("on_chip"): the DMA prefetches a kernel's inputs only from the
    previous kernel's last tile on (`pe_array.system.run_system`), so V, the PV's input,
    would load during the short softmax_exp's last tile and the PV's first tile would wait
    for most of it; softmax_max's load overlaps the scores' last tile instead
    (docs/conventions.md#block-attention)."""
    out = []
    for kr in kernels:
        if kr.name.startswith("softmax_"):  # the max's levels too (no accmax unit)
            fetch = "keep" if kr.name == "softmax_max" else "on_chip"
            kr = dataclasses.replace(kr, buffers=(*kr.buffers, Buffer("V", size, fetch=fetch,
                                                                        spm_base=base)))
        elif kr.name == "spmm":
            kr = dataclasses.replace(kr, buffers=tuple(
                dataclasses.replace(b, fetch="on_chip", spm_base=base) if b.name == "V" else b
                for b in kr.buffers))
        out.append(kr)
    return tuple(out)


def lower_attention_block(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
                          crd: np.ndarray, lanes: int = BODY_ROWS, dtype=np.float32,
                          edge: int | None = None, on_chip: bool = True,
                          accmax: bool = True, fill: bool = False) -> Program:
    """The attention `Program` of a block-sparse mask (module docstring); `edge` the block
    edge (None: the largest the mask is whole blocks of). `on_chip`: the intermediates are
    handed over in the SPM (`held_layout`), else through DRAM. `accmax`: the array has a
    max-accumulate unit (else `strip_max_levels`). `fill`: a mask that is not whole blocks
    runs over the blocks it touches, the fillers masked by a `bias` input (`block_fill.py`;
    `edge` then the covering's, default 8). Raises DFGError when the mask is not whole
    aligned blocks of a multiple of 8 (the lanes of a body row) and not `fill` or not
    covered. Output `O` (m x dv)."""
    (m, d), (n, _), (_, dv) = q.shape, k.shape, v.shape
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    if lanes != BODY_ROWS:
        raise DFGError(f"block lowering needs {BODY_ROWS} SIMD lanes, got {lanes}")
    got = (find_blocks(pos, crd, m, n) if edge is None
           else block_structure(pos, crd, m, n, edge))
    bias = None
    if got is None and fill:
        edge = BODY_ROWS if edge is None else edge
        cover = cover_structure(pos, crd, m, n, edge, lanes)
        if cover is not None:
            got = cover
            bias, pattern = filler_bias(pos, crd, m, edge, *cover, dtype=dtype)
    if got is None:
        raise DFGError("block lowering needs a mask of whole aligned blocks whose edge is a "
                       f"multiple of {BODY_ROWS} (bigbird), or fill=True and a mask whose "
                       "covered panels attend a key in every row; use lowering='csr'")
    if len(got) == 3:
        edge, bpos, bcrd = got
    else:
        bpos, bcrd = got
    bh, blocks = edge, len(bcrd)
    kpos = bpos * bh
    kcrd = (bcrd[:, None] * bh + np.arange(bh)[None, :]).ravel()
    # the kept blocks in CSC order (by key block in the sddmm's order, then panel): the
    # sddmm's; the fillers' bias patterns (`block_fill.py`) are in the natural order
    brow_csr = np.repeat(np.arange(m // bh, dtype=np.int64), np.diff(bpos))
    korder = (np.arange(n // bh, dtype=np.int64) if bias is not None
              else key_block_order(bcrd, m // bh, n // bh))
    rank = np.empty_like(korder)
    rank[korder] = np.arange(len(korder))
    order = np.lexsort((brow_csr, rank[bcrd]))
    cidx = np.empty(blocks, dtype=np.int64)
    cidx[order] = np.arange(blocks)
    cpos = np.concatenate(([0], np.cumsum(np.bincount(bcrd, minlength=n // bh)[korder])))
    scale = 1.0 / math.sqrt(d)
    filled = bias is not None
    table = len(bias) if filled else 0
    smax, sexp = strip_softmax_kernels(m, bh, bpos, scale, bias=table)
    smax, extra = ((smax,), ()) if accmax else strip_max_levels(m, bh, bpos, cidx, table)
    if filled:  # the table, the blocks' patterns in CSR order (softmax) and CSC (level 0)
        extra = (*extra, ("bias", bias), ("bpat", pattern[cidx]))
        if not accmax:
            extra = (*extra, ("bpat_c", pattern))
    kernels = (block_sddmm_kernel(m, n, d, bh, cpos), *smax, sexp,
               normalised_pv_kernel(m, n, dv, bh, kpos))
    if on_chip:  # the intermediates never cross the DRAM interface
        layout = held_layout(m, bh, blocks, None if accmax else m * d)
        if not accmax:  # the levels hold St too (unread), so their buffers land above it
            kernels = tuple(
                dataclasses.replace(kr, buffers=(*kr.buffers, Buffer("St", blocks * bh * bh)))
                if kr.name.startswith("softmax_max_") else kr for kr in kernels)
        kernels = tuple(hold_on_chip(kr, layout) for kr in kernels)
        if accmax:
            kernels = _early_v(kernels, n * dv, held_align(held_words(m, bh, blocks)))
        else:  # Q_p is loaded whole ("keep") under St; no later kernel reads it
            kernels = tuple(dataclasses.replace(kr, buffers=tuple(
                dataclasses.replace(b, fetch="keep") if b.name == "Q_p" else b
                for b in kr.buffers)) for kr in kernels)
    kperm = (korder[:, None] * bh + np.arange(bh)[None, :]).ravel()  # K's rows, reordered
    prog = Program(
        name=f"attention_block{bh}_{m}x{n}x{d}_blocks{blocks}{'_fill' if filled else ''}",
        kernels=kernels,
        inputs=(("brow", brow_csr[order]), ("Q_p", pack_panels(q, bh, dtype)),
                ("K_b", pack_panels(np.asarray(k)[kperm], bh, dtype)), ("cidx", cidx),
                ("kcrd", np.concatenate((kcrd, np.zeros(SPARE_SLOTS, dtype=np.int64)))),
                ("V", np.ascontiguousarray(v, dtype=dtype).ravel()), *extra),
        outputs=(("O", (m, dv)),), dtype=np.dtype(dtype).name, macs=len(crd) * (d + dv),
    )
    return run_passes(prog)


__all__ = ["BLOCK_KERNELS", "block_structure", "find_blocks", "key_block_order",
           "lower_attention_block"]
