"""The CSR attention's softmax over rows of one width (docs/conventions.md#row-softmax).

A mask whose rows all attend the same number T of keys (butterfly: the key itself and one per
power-of-two stride, T = 1 + log2 seq; N:M) has its row i's scores at S[i * T + t], t < T: an
affine address. On an array without an accmax unit the CSR softmax's row maximum would be
levels of `max` kernels over the entries (`dfg/row_max.py`, four kernels at T = 11); here it
is one kernel over the rows whose body loads the T scores of a row and reduces them by a tree
of `max` (exact: the same maximum), and the exp kernel likewise takes a whole row per
iteration (T loads, subtractions, exps and stores, the row sum a tree of adds stored once).

`lower_attention(row_bodies=True)` takes them where `row_width` finds one width;
`SparseAttention` asks for them on an array without accmax (on one with it, the accmax kernel
folds into the scores' kernel instead, docs/conventions.md#attention-fold).
"""

from __future__ import annotations

import dataclasses

import numpy as np

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


def row_max_kernel(m: int, width: int) -> Kernel:
    """rowmax[i] = max_t S[i * width + t]: one iteration per row, a tree of `max`."""
    nodes: list[Node] = []
    root = _tree(nodes, _loads(nodes, "S", width), Op.MAX, "max")
    nodes.append(Node(len(nodes), Op.STORE, (root,), buffer="rowmax", addr=Addr((("i", 1),)),
                      name="rowmax="))
    return Kernel(name="softmax_max", loops=(Loop("i", m),), nodes=tuple(nodes),
                  buffers=(Buffer("S", m * width), Buffer("rowmax", m, "output")))


def row_exp_kernel(m: int, width: int, scale: float) -> Kernel:
    """E[i * width + t] = exp(scale * (S[i * width + t] - rowmax[i])); rowsum[i] = their
    sum (a tree of adds, stored once): one iteration per row. (Measured against one kernel
    that takes the maximum too, in registers: the two run 194 cycles faster on `mlx_4x4`,
    seq 1024; the maximum's short kernel runs while V loads.)"""
    nodes: list[Node] = []
    s = _loads(nodes, "S", width)
    nodes.append(Node(len(nodes), Op.LOAD, buffer="rowmax", addr=Addr((("i", 1),)),
                      name="max"))
    mx = len(nodes) - 1
    nodes.append(Node(len(nodes), Op.CONST, value=scale, name="1/sqrt(d)"))
    sc = len(nodes) - 1
    exps = []
    for t, x in enumerate(s):
        nodes.append(Node(len(nodes), Op.SUB, (x, mx), name="s-max"))
        nodes.append(Node(len(nodes), Op.MUL, (len(nodes) - 1, sc), name="*scale"))
        nodes.append(Node(len(nodes), Op.EXP, (len(nodes) - 1,), name="exp"))
        e = len(nodes) - 1
        nodes.append(Node(len(nodes), Op.STORE, (e,), buffer="E",
                          addr=Addr((("i", width),), t), name=f"E[{t}]="))
        exps.append(e)
    root = _tree(nodes, exps, Op.ADD, "sum")
    nodes.append(Node(len(nodes), Op.STORE, (root,), buffer="rowsum", addr=Addr((("i", 1),)),
                      name="rowsum="))
    return Kernel(name="softmax_exp", loops=(Loop("i", m),), nodes=tuple(nodes),
                  buffers=(Buffer("S", m * width), Buffer("rowmax", m),
                           Buffer("E", m * width, "output"), Buffer("rowsum", m, "output")))


#: SPM words a held buffer's base is aligned to (as `lower_block.HELD_ALIGN`)
ALIGN = 128


#: the kernel that loads V for the spmm (its load overlaps that kernel, not the spmm)
KEEPS_V = "softmax_exp"


def _align(words: int) -> int:
    return -(-words // ALIGN) * ALIGN


def held_layout(m: int, entries: int, v_words: int) -> dict[str, tuple[int, int]]:
    """(size, spm_base) of the buffers handed from kernel to kernel in the SPM: the scores
    S (sddmm -> both softmax kernels), the row maxima, the probabilities E and the row sums
    (softmax_exp -> spmm), then V (loaded by softmax_max, read by the spmm)."""
    out, base = {}, 0
    for name, size in (("S", entries), ("rowmax", m), ("E", entries), ("rowsum", m),
                       ("V", v_words)):
        out[name] = (size, base)
        base = _align(base + size)
    return out


def held_words(m: int, entries: int, v_words: int) -> int:
    return max(base + size for size, base in held_layout(m, entries, v_words).values())


def hand_over(kernels: tuple[Kernel, ...], m: int, entries: int,
              v_words: int) -> tuple[Kernel, ...]:
    """The kernels with S, rowmax, E and rowsum held in the SPM between them (`held_layout`)
    and V loaded whole by `softmax_max` ("keep") and left there through `softmax_exp` to the
    spmm, so its load overlaps the softmax instead of holding the spmm's first tile."""
    lay = held_layout(m, entries, v_words)
    out = []
    for kr in kernels:
        bufs = list(kr.buffers)
        if kr.name == KEEPS_V:
            bufs.append(Buffer("V", v_words))
        bufs = [dataclasses.replace(
            b, fetch="keep" if (b.name, kr.name) == ("V", KEEPS_V) else "on_chip",
            spm_base=lay[b.name][1]) if b.name in lay else b for b in bufs]
        out.append(dataclasses.replace(kr, buffers=tuple(bufs)))
    return tuple(out)


__all__ = ["MAX_ROW_WIDTH", "hand_over", "held_layout", "held_words", "row_exp_kernel",
           "row_max_kernel", "row_width"]
