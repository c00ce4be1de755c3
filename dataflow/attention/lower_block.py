"""Attention over a block-sparse mask as gathered GEMMs (docs/conventions.md#block-attention).

A BigBird mask is a set of whole b x b blocks (b a multiple of the 8 lanes): query panel tr
(rows b tr .. b tr + b - 1) attends the keys of its kept key blocks, whose block columns `bcrd`
(`bpos` per panel) the host knows (the pattern is static). The CSR lowering (`lower.py`) walks
the entries one gathered SPM row at a time; here every loaded row feeds eight maccs, as the
dense GEMM's 8 x 1 outer-product body (`plan.gemm_schedule`) and the gathered-panel GEMM of
`dataflow/dynamic/panel_gemm.py` (docs/conventions.md#dynamic-panel-gemm) do. Scores are kept
in *strip layout*: kept key kappa (the g-th kept key over all panels) owns the b words
St[b g .. b g + b - 1], its scores against the panel's b query rows, so the query rows are the
lanes. K is stored transposed (K^T: d x n) and Q as panels of Q^T (`pack_panels`): host layouts,
as `pack_strips`.

1. `key_compact` (SRead): K_c[(p d + c) b + e] = K^T[c, b bcrd[p] + e] for every kept block p,
   so that a block's K^T slice is affine in p (a span load needs an affine address).
2. `sddmm`: for panel tr, kept block p, 8-key half h, query vector r and c < d:

       a = K_c[(p d + c) b + 8 h : +8]          one SPM row: 8 keys at dimension c
       b = Q_p[(tr d + c) b + r] = Q^T[c, b tr + r]   the panel's query rows (vector; Q packed
                                                      in panels, `pack_panels`)
       St[(b p + 8 h + u) b + r] += a.lane(u) * b       u = 0 .. 7, accumulated over c

3. `softmax_max`: rowmax[b tr + r] = max over the panel's kept strips (elementwise over the
   query-row lanes: no lane reduction).
4. `softmax_exp`: E = exp(scale (St - rowmax)), rowsum[b tr + r] += E (elementwise).
5. `spmm`: `panel_gemm_kernel` with A_c = E (strip height b), B = V gathered by kept key
   (`kcrd`), the softmax's normalisation folded as in docs/conventions.md#attention-fold: each
   E row is divided by its 8 query rows' sums as loaded (the division a kernel writing P would
   make, so the same values), then O[b tr + 8 ib + u, j] += P.lane(u) * V[kcrd[p], j].

The compiler's generic search (`plan.compile.kernel_candidates`) fuses the products into
maccs with accumulators in registers over the reduction and blocks the vector loop.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.dynamic.panel_gemm import BODY_ROWS, SPARE_SLOTS

#: the kernels of the block lowering, in program order (tests check these)
BLOCK_KERNELS = ("key_compact", "sddmm", "softmax_max", "softmax_exp", "spmm")
#: block edges tried, largest first (a larger block: fewer kept blocks, longer strips)
BLOCK_EDGES = (64, 32, 16, 8)


def block_structure(pos: np.ndarray, crd: np.ndarray, m: int, n: int, edge: int,
                    lanes: int = BODY_ROWS) -> tuple[np.ndarray, np.ndarray] | None:
    """(bpos, bcrd): the kept edge x edge blocks of the CSR mask (m x n) per query panel, when
    the mask is exactly whole aligned blocks and edge is a multiple of `lanes` dividing m and
    n; else None."""
    if edge % lanes or m % edge or n % edge or len(crd) == 0:
        return None
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(pos))
    nbj = n // edge
    blocks, counts = np.unique((rows // edge) * nbj + np.asarray(crd) // edge,
                               return_counts=True)
    if (counts != edge * edge).any():  # csr has no repeats, so a full block has edge^2 entries
        return None
    bi, bj = blocks // nbj, blocks % nbj
    bpos = np.concatenate(([0], np.cumsum(np.bincount(bi, minlength=m // edge))))
    return bpos.astype(np.int64), bj.astype(np.int64)


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


def key_compact_kernel(n: int, d: int, bh: int, blocks: int) -> Kernel:
    """K_c[(p d + c) bh + e] = K^T[c n + bh bcrd[p] + e]: each kept block's K^T slice gathered
    in block order (vector over e, the block's keys)."""
    nodes = (
        Node(0, Op.LOAD, buffer="bcrd", addr=Addr((("p", 1),)), name="bcrd"),
        Node(1, Op.GATHER, (0,), buffer="KT", addr=Addr((("c", n), ("e", 1)), index_stride=bh),
             name="SRead K^T"),
        Node(2, Op.STORE, (1,), buffer="K_c", addr=Addr((("p", d * bh), ("c", bh), ("e", 1))),
             name="K_c="),
    )
    return Kernel(name="key_compact", loops=(Loop("p", blocks), Loop("c", d), Loop("e", bh)),
                  nodes=nodes,
                  buffers=(Buffer("bcrd", blocks), Buffer("KT", d * n),
                           Buffer("K_c", blocks * d * bh, "output")),
                  vector_var="e")


def block_sddmm_kernel(m: int, d: int, bh: int, bpos: np.ndarray,
                       by_block: bool = False) -> Kernel:
    """St[(bh p + 8 h + u) bh + r] = sum_c K_c[(p d + c) bh + 8 h + u] * Q_p[(tr d + c) bh + r]
    over the kept blocks p of each panel tr: the 8 x 1 outer product of one K_c row (8 keys,
    span) and a vector of the panel's query rows, accumulated over c (module docstring, step
    2). `by_block`: the outer loop runs over the kept blocks instead of the panels, each
    block's panel rows of Q gathered through `bpanel` (the same rows for all the blocks of a
    panel), so the kernel tiles by blocks: a global panel keeps every block, and its K_c alone
    may not fit a small SPM double-buffered (`panel_fits`)."""
    blocks = int(bpos[-1])
    if by_block:
        nodes = [Node(0, Op.LOAD, buffer="bpanel", addr=Addr((("p", 1),)), name="panel"),
                 Node(1, Op.GATHER, (0,), buffer="Q_p",
                      addr=Addr((("c", bh), ("r", 1)), index_stride=d * bh), name="Q^T")]
        loops = (Loop("p", blocks),)
        extra, domain = (Buffer("bpanel", blocks),), ()
    else:
        nodes = [Node(0, Op.LOAD, buffer="Q_p",
                      addr=Addr((("tr", d * bh), ("c", bh), ("r", 1))), name="Q^T")]
        loops = (Loop("tr", m // bh), Loop("p", pos="tile_pos", parent="tr"))
        extra, domain = (), (("tile_pos", np.asarray(bpos, dtype=np.int64)),)
    q = nodes[-1].id
    carried = []
    for h in range(bh // BODY_ROWS):  # every 8-key row of the block in one body
        k_row = len(nodes)
        nodes.append(Node(k_row, Op.LOAD, buffer="K_c",
                          addr=Addr((("p", d * bh), ("c", bh)), const=BODY_ROWS * h,
                                    span=BODY_ROWS), name=f"K_c[{h}]"))
        for u in range(BODY_ROWS):
            mul, acc = len(nodes), len(nodes) + 1
            key = BODY_ROWS * h + u
            nodes += [Node(mul, Op.MUL, (k_row, q), lane=u, name=f"k{key}*q"),
                      Node(acc, Op.ACC, (mul,), buffer="St",
                           addr=Addr((("p", bh * bh), ("r", 1)), const=key * bh),
                           name=f"St{key}+=")]
            carried.append((acc, acc, 1))
    return Kernel(name="sddmm",
                  loops=(*loops, Loop("r", bh), Loop("c", d)),
                  nodes=tuple(nodes),
                  buffers=(Buffer("K_c", blocks * d * bh), *extra, Buffer("Q_p", d * m),
                           Buffer("St", blocks * bh * bh, "output")),
                  vector_var="r", carried=tuple(carried), domain_arrays=domain)


def panel_fits(d: int, bh: int, bpos: np.ndarray, capacity_words: int | None) -> bool:
    """Whether the panel with the most kept blocks has its K_c and scores double-buffered in
    a quarter of the SPM (else the sddmm loops over blocks, `block_sddmm_kernel`)."""
    if capacity_words is None:
        return True
    most = int(np.diff(bpos).max(initial=0))
    return 2 * most * bh * (d + bh) <= capacity_words // 4


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


def strip_softmax_kernels(m: int, bh: int, bpos: np.ndarray, scale: float):
    """`softmax_max` and `softmax_exp` over the strips (module docstring, steps 3-4)."""
    size = int(bpos[-1]) * bh * bh
    st = Addr((("p", bh * bh), ("k", bh), ("r", 1)))
    row = Addr((("tr", bh), ("r", 1)))
    smax = _strip_kernel(
        "softmax_max", m, bh, bpos,
        [Node(0, Op.LOAD, buffer="St", addr=st, name="s"),
         Node(1, Op.ACC_MAX, (0,), buffer="rowmax", addr=row, name="max=")],
        [Buffer("St", size), Buffer("rowmax", m, "output", init=-math.inf)], ((1, 1, 1),))
    sexp = _strip_kernel(
        "softmax_exp", m, bh, bpos,
        [Node(0, Op.LOAD, buffer="St", addr=st, name="s"),
         Node(1, Op.LOAD, buffer="rowmax", addr=row, name="max"),
         Node(2, Op.SUB, (0, 1), name="s-max"),
         Node(3, Op.CONST, value=scale, name="1/sqrt(d)"),
         Node(4, Op.MUL, (2, 3), name="*scale"),
         Node(5, Op.EXP, (4,), name="exp"),
         Node(6, Op.STORE, (5,), buffer="E", addr=st, name="E="),
         Node(7, Op.ACC, (5,), buffer="rowsum", addr=row, name="sum+=")],
        [Buffer("St", size), Buffer("rowmax", m), Buffer("E", size, "output"),
         Buffer("rowsum", m, "output")], ((7, 7, 1),))
    return smax, sexp


#: items one level of the accmax-free strip maximum reduces to one (`strip_max_levels`)
LEVEL_WIDTH = 8


def strip_max_levels(m: int, bh: int, bpos: np.ndarray):
    """(kernels, inputs): the strips' row maximum without an accmax unit (the MLX preset;
    docs/conventions.md#block-attention), from loads, gathers, `max` and stores. Level 0
    (`softmax_max`) takes each kept block's maximum over its bh key strips (affine: a block's
    strips are consecutive); each next level (`softmax_max_<l>`) gathers `LEVEL_WIDTH` items
    of a panel (the last chunk padded by repeating the panel's last item: max is idempotent)
    into one, until every panel has one item, which the last level writes to rowmax[bh tr + r].
    The maximum is exact, so the values equal the accmax's."""
    row = Addr((("o", bh), ("r", 1)))
    nodes = [Node(k, Op.LOAD, buffer="St", addr=Addr((("o", bh * bh), ("r", 1)), const=k * bh),
                  name=f"s{k}") for k in range(bh)]
    nodes += _max_tree(nodes)
    counts = np.diff(bpos)
    items = int(bpos[-1])
    final = bool((counts == 1).all())  # one block per panel: its maximum is the row's
    out_buf = "rowmax" if final else "BM0"
    out_size = m if final else items * bh
    nodes.append(Node(len(nodes), Op.STORE, (nodes[-1].id,), buffer=out_buf, addr=row,
                      name=f"{out_buf}="))
    kernels = [Kernel(name="softmax_max", loops=(Loop("o", items), Loop("r", bh)),
                      nodes=tuple(nodes),
                      buffers=(Buffer("St", items * bh * bh),
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


def _align(words: int) -> int:
    return -(-words // HELD_ALIGN) * HELD_ALIGN


def held_layout(m: int, d: int, bh: int, blocks: int) -> dict[str, tuple[int, int]]:
    """(size, spm_base) of each buffer handed from kernel to kernel in the SPM
    (docs/conventions.md#moe-buffers-handed-over-in-the-spm): K_c (key_compact -> sddmm) from
    word 0, then the scores St (sddmm -> both softmax kernels) and the row statistics; the
    probabilities E (softmax_exp -> spmm) reuse K_c's words, dead after the sddmm."""
    kc, st = blocks * d * bh, blocks * bh * bh
    at = _align(kc)
    out = {"K_c": (kc, 0), "St": (st, at), "E": (st, 0)}
    at = _align(at + st)
    out["rowmax"] = (m, at)
    out["rowsum"] = (m, _align(at + m))
    return out


def held_words(m: int, d: int, bh: int, blocks: int) -> int:
    """The most SPM words the held buffers take in any one kernel (the sddmm's K_c and St)."""
    lay = held_layout(m, d, bh, blocks)
    return max(base + size for size, base in lay.values())


def _hand_over(kernel: Kernel, layout: dict[str, tuple[int, int]]) -> Kernel:
    """The kernel with its buffers of `layout` held on chip at their words."""
    bufs = tuple(dataclasses.replace(b, fetch="on_chip", spm_base=layout[b.name][1])
                 if b.name in layout else b for b in kernel.buffers)
    return dataclasses.replace(kernel, buffers=bufs)


def lower_attention_block(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray,
                          crd: np.ndarray, lanes: int = BODY_ROWS, dtype=np.float32,
                          edge: int | None = None, on_chip: bool = True,
                          accmax: bool = True, capacity_words: int | None = None) -> Program:
    """The attention `Program` of a block-sparse mask (module docstring); `edge` the block
    edge (None: the largest the mask is whole blocks of). Raises DFGError when the mask is not
    whole aligned blocks of a multiple of 8 (the lanes of a body row). Output `O` (m x dv)."""
    (m, d), (n, _), (_, dv) = q.shape, k.shape, v.shape
    pos, crd = np.asarray(pos, dtype=np.int64), np.asarray(crd, dtype=np.int64)
    if lanes != BODY_ROWS:
        raise DFGError(f"block lowering needs {BODY_ROWS} SIMD lanes, got {lanes}")
    got = (find_blocks(pos, crd, m, n) if edge is None
           else block_structure(pos, crd, m, n, edge))
    if got is None:
        raise DFGError("block lowering needs a mask of whole aligned blocks whose edge is a "
                       f"multiple of {BODY_ROWS} (bigbird); use lowering='csr'")
    if edge is None:
        edge, bpos, bcrd = got
    else:
        bpos, bcrd = got
    bh, blocks = edge, len(bcrd)
    kpos = bpos * bh
    kcrd = (bcrd[:, None] * bh + np.arange(bh)[None, :]).ravel()
    scale = 1.0 / math.sqrt(d)
    smax, sexp = strip_softmax_kernels(m, bh, bpos, scale)
    by_block = not panel_fits(d, bh, bpos, capacity_words)
    smax, extra = ((smax,), ()) if accmax else strip_max_levels(m, bh, bpos)
    kernels = (key_compact_kernel(n, d, bh, blocks), block_sddmm_kernel(m, d, bh, bpos, by_block),
               *smax, sexp, normalised_pv_kernel(m, n, dv, bh, kpos))
    if on_chip:  # the intermediates never cross the DRAM interface
        layout = held_layout(m, d, bh, blocks)
        kernels = tuple(_hand_over(kr, layout) for kr in kernels)
    prog = Program(
        name=f"attention_block{bh}_{m}x{n}x{d}_blocks{blocks}", kernels=kernels,
        inputs=(("bcrd", bcrd),
                *((("bpanel", np.repeat(np.arange(m // bh), np.diff(bpos))),) if by_block
                  else ()),
                ("KT", np.ascontiguousarray(k.T, dtype=dtype).ravel()),
                ("Q_p", pack_panels(q, bh, dtype)),
                ("kcrd", np.concatenate((kcrd, np.zeros(SPARE_SLOTS, dtype=np.int64)))),
                ("V", np.ascontiguousarray(v, dtype=dtype).ravel()), *extra),
        outputs=(("O", (m, dv)),), dtype=np.dtype(dtype).name, macs=len(crd) * (d + dv),
    )
    return run_passes(prog)


__all__ = ["BLOCK_KERNELS", "block_structure", "find_blocks", "lower_attention_block"]
