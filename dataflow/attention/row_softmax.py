"""The CSR attention's softmax over rows of one width (docs/conventions.md#row-softmax).

A mask whose rows all attend the same number T of keys (butterfly: the key itself and one per
power-of-two stride, T = 1 + log2 seq; N:M) has row i's scores at S[i * T + t], t < T: an
affine address. On an array without an accmax unit the CSR softmax's row maximum would be
levels of `max` kernels over the entries (`dfg/row_max.py`: four kernels at T = 11, each
level's buffer through DRAM); here the softmax is one kernel over the rows whose body loads the
T scores of a row, reduces them by a tree of `max` (exact: the same maximum; in registers,
never stored), sums E = exp(scale * (S - max)) by a tree of adds and stores the
probabilities P = E / sum: the normalisation is the softmax's here, not the SpMM's
(docs/conventions.md#attention-fold), since the row's sum is in the same body; the SpMM is
the plain CSR SpMM over P.

`lower_attention(row_bodies=True)` takes it where `row_width` finds one width;
`SparseAttention` asks for it on every array (measured faster than the CSR softmax with and
without an accmax unit, where the maximum would fold into the scores'
kernel, docs/conventions.md#attention-fold). With
`on_chip=True`, S and P stay in the SPM (`hand_over`): the softmax then streams
nothing and runs as one tile, so the DMA loads the spmm's V during it.
"""

from __future__ import annotations

import numpy as np

from dataflow.attention.lower_block import held_align, hold_on_chip
from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node
from dataflow.dfg.ops import Op

#: widest row the row bodies take (loads and ops a body holds)
MAX_ROW_WIDTH = 16


def row_width(pos: np.ndarray) -> int | None:
    """T when every row of the CSR mask has T entries (2 <= T <= `MAX_ROW_WIDTH`), else None."""
    lengths = np.diff(np.asarray(pos, dtype=np.int64))
    if len(lengths) == 0 or not (lengths == lengths[0]).all():
        return None
    t = int(lengths[0])
    return t if 2 <= t <= MAX_ROW_WIDTH else None


def _tree(nodes: list[Node], leaves: list[int], op: Op, name: str) -> int:
    """Append a balanced tree of `op` over `leaves` to `nodes`; the root's id."""
    level = list(leaves)
    while len(level) > 1:
        nxt = []
        for a, b in zip(level[::2], level[1::2]):
            nodes.append(Node(len(nodes), op, (a, b), name=name))
            nxt.append(len(nodes) - 1)
        level = nxt + ([level[-1]] if len(level) % 2 else [])
    return level[0]


def _loads(nodes: list[Node], buffer: str, width: int) -> list[int]:
    for t in range(width):
        nodes.append(Node(len(nodes), Op.LOAD, buffer=buffer, addr=Addr((("i", width),), t),
                          name=f"{buffer.lower()}[{t}]"))
    return list(range(len(nodes) - width, len(nodes)))


def row_softmax_kernel(m: int, width: int, scale: float) -> Kernel:
    """One iteration per row: its maximum a tree of `max` over the row's `width` scores (in
    registers, never stored), E[i * width + t] = exp(scale * (S[i * width + t] - max)) and
    their sum a tree of adds; P[i * width + t] = E / sum, the division the CSR program's SpMM
    makes as it loads E (docs/conventions.md#attention-fold)."""
    nodes: list[Node] = []
    s = _loads(nodes, "S", width)
    mx = _tree(nodes, s, Op.MAX, "max")
    nodes.append(Node(len(nodes), Op.CONST, value=scale, name="1/sqrt(d)"))
    sc = len(nodes) - 1
    exps = []
    for x in s:
        nodes.append(Node(len(nodes), Op.SUB, (x, mx), name="s-max"))
        nodes.append(Node(len(nodes), Op.MUL, (len(nodes) - 1, sc), name="*scale"))
        nodes.append(Node(len(nodes), Op.EXP, (len(nodes) - 1,), name="exp"))
        exps.append(len(nodes) - 1)
    root = _tree(nodes, exps, Op.ADD, "sum")
    for t, e in enumerate(exps):
        nodes.append(Node(len(nodes), Op.DIV, (e, root), name="e/sum"))
        nodes.append(Node(len(nodes), Op.STORE, (len(nodes) - 1,), buffer="P",
                          addr=Addr((("i", width),), t), name=f"P[{t}]="))
    return Kernel(name="softmax", loops=(Loop("i", m),), nodes=tuple(nodes),
                  buffers=(Buffer("S", m * width), Buffer("P", m * width, "output")))


def held_layout(m: int, entries: int) -> dict[str, tuple[int, int]]:
    """(size, spm_base) of the buffers handed from kernel to kernel in the SPM: the scores S
    (sddmm -> softmax), then the probabilities P (softmax -> spmm)."""
    out, base = {}, 0
    for name, size in (("S", entries), ("P", entries)):
        out[name] = (size, base)
        base = held_align(base + size)
    return out


def held_words(m: int, entries: int) -> int:
    """The SPM words the held buffers span (`held_layout`)."""
    return max(base + size for size, base in held_layout(m, entries).values())


def hand_over(kernels: tuple[Kernel, ...], m: int, entries: int) -> tuple[Kernel, ...]:
    """The kernels with S and P held in the SPM between them (`held_layout`): no
    kernel streams them, so the softmax streams nothing and runs as one tile, and the DMA
    loads the spmm's V during it (`mapper.tiling.tile_and_allocate`, `pe_array.system`)."""
    lay = held_layout(m, entries)
    return tuple(hold_on_chip(kr, lay) for kr in kernels)


__all__ = ["MAX_ROW_WIDTH", "hand_over", "held_layout", "held_words", "row_softmax_kernel",
           "row_width"]
