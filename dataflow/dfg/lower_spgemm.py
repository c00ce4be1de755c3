"""Lowering of SpGEMM, C = A @ B with both operands CSR: Gustavson's row-wise product.

Row i of C is the sum over A's entries p of row i of A.val[p] * (row A.crd[p] of B): the rows
of B are gathered through A's crd. Like every two-phase SpGEMM, the work splits into
- a symbolic phase (`gustavson_symbolic`, pos/crd only, no values): it enumerates the partial
  products (p, q) in Gustavson order (row i, then p along A's row, then q along B's row
  A.crd[p]), and groups them by the output entry (i, B.crd[q]) they add into. That gives C's
  structure and, per output entry, its list of contributions (a stable sort, so each list keeps
  Gustavson order);
- a numeric phase, one kernel: for i, for s in C's row i, for t in s's contributions:
  C.val[s] += A.val[a_idx[t]] * B.val[b_idx[t]] (two gathers, a multiply, an accumulate).

The engine's ACC takes affine addresses only, so the classic dense row accumulator (SPA, an
indirect += at column B.crd[q]) is not expressible; grouping the contributions by output entry
instead keeps each C entry in the ACC register until its list ends (one SPM write per entry),
the way SpMM keeps a C vector there. Work: one iteration per partial product, the flop count
of Gustavson's algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op


@dataclass(frozen=True, eq=False)
class SpgemmStructure:
    """C's CSR structure (`pos`, `crd`) and the contributions of each of its entries:
    entry s adds A.val[a_idx[t]] * B.val[b_idx[t]] for t in contrib_pos[s]..contrib_pos[s+1]."""

    shape: tuple[int, int]
    pos: np.ndarray
    crd: np.ndarray
    contrib_pos: np.ndarray
    a_idx: np.ndarray
    b_idx: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.pos[-1])

    @property
    def products(self) -> int:
        """Partial products (multiplies) of the numeric phase."""
        return len(self.a_idx)


def _check_csr(name: str, rows: int, cols: int, pos, crd) -> None:
    if len(pos) != rows + 1 or int(pos[-1]) != len(crd):
        raise DFGError(f"malformed CSR operand {name}: pos has {len(pos)} entries for {rows} "
                       f"rows, pos[-1] = {int(pos[-1]) if len(pos) else None}, crd {len(crd)}")
    if len(crd) and (int(np.min(crd)) < 0 or int(np.max(crd)) >= cols):
        raise DFGError(f"CSR operand {name}: column index out of range [0, {cols})")


def gustavson_symbolic(a_shape: tuple[int, int], a_pos, a_crd, b_shape: tuple[int, int],
                       b_pos, b_crd) -> SpgemmStructure:
    """The symbolic phase of C = A @ B (see the module doc); reads pos/crd arrays only."""
    (m, k), (k2, n) = a_shape, b_shape
    if k != k2:
        raise DFGError(f"matmul shapes do not agree: A is {m}x{k}, B is {k2}x{n} ({k} != {k2})")
    _check_csr("A", m, k, a_pos, a_crd)
    _check_csr("B", k, n, b_pos, b_crd)
    a_pos, a_crd = np.asarray(a_pos, np.int64), np.asarray(a_crd, np.int64)
    b_pos, b_crd = np.asarray(b_pos, np.int64), np.asarray(b_crd, np.int64)
    b_start = b_pos[a_crd]  # gather B's row through A's crd
    counts = b_pos[a_crd + 1] - b_start
    total = int(counts.sum())
    p = np.repeat(np.arange(len(a_crd), dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    q = b_start[p] + np.arange(total, dtype=np.int64) - first[p]
    row = np.repeat(np.arange(m, dtype=np.int64), np.diff(a_pos))[p]
    key = row * n + b_crd[q]
    order = np.argsort(key, kind="stable")  # stable: Gustavson order within each entry
    key = key[order]
    head = np.ones(total, bool)
    head[1:] = key[1:] != key[:-1]
    out_keys = key[head]
    contrib_pos = np.concatenate([np.flatnonzero(head), [total]]).astype(np.int64)
    pos = np.concatenate([[0], np.cumsum(np.bincount(out_keys // max(n, 1), minlength=m))])
    return SpgemmStructure((m, n), pos.astype(np.int64), (out_keys % max(n, 1)).astype(np.int64),
                           contrib_pos, p[order], q[order])


def spgemm_gustavson_kernel(st: SpgemmStructure, nnz_a: int, nnz_b: int,
                            name: str = "spgemm_gustavson") -> Kernel:
    m, _ = st.shape
    nodes = (
        Node(0, Op.LOAD, buffer="A_idx", addr=Addr((("t", 1),)), name="a_idx"),
        Node(1, Op.GATHER, (0,), buffer="A_val", addr=Addr(index_stride=1), name="A.val[idx]"),
        Node(2, Op.LOAD, buffer="B_idx", addr=Addr((("t", 1),)), name="b_idx"),
        Node(3, Op.GATHER, (2,), buffer="B_val", addr=Addr(index_stride=1), name="B.val[idx]"),
        Node(4, Op.MUL, (1, 3), name="a*b"),
        Node(5, Op.ACC, (4,), buffer="C_val", addr=Addr((("s", 1),)), name="C.val+="),
    )
    return Kernel(
        name=name,
        loops=(Loop("i", m), Loop("s", pos="C_pos", parent="i"),
               Loop("t", pos="T_pos", parent="s")),
        nodes=nodes,
        buffers=(Buffer("A_idx", st.products), Buffer("A_val", nnz_a),
                 Buffer("B_idx", st.products), Buffer("B_val", nnz_b),
                 Buffer("C_val", st.nnz, "output")),
        carried=((5, 5, 1),),  # the accumulator register
        domain_arrays=(("C_pos", st.pos), ("T_pos", st.contrib_pos)),
    )


def lower_spgemm_csr(a_shape: tuple[int, int], a_pos, a_crd, a_val, b_shape: tuple[int, int],
                     b_pos, b_crd, b_val, dtype=np.float32,
                     structure: SpgemmStructure | None = None) -> Program:
    """SpGEMM program for CSR A @ CSR B. The output `C_val` holds one value per entry of C's
    structure (`structure.pos`/`crd`, from `gustavson_symbolic`; computed here if not given)."""
    if len(a_val) != len(a_crd) or len(b_val) != len(b_crd):
        raise DFGError(f"CSR values and coordinates differ in length: A {len(a_val)} vs "
                       f"{len(a_crd)}, B {len(b_val)} vs {len(b_crd)}")
    st = structure or gustavson_symbolic(a_shape, a_pos, a_crd, b_shape, b_pos, b_crd)
    (m, k), n = a_shape, b_shape[1]
    kern = spgemm_gustavson_kernel(st, len(a_val), len(b_val))
    prog = Program(
        name=f"spgemm_gustavson_{m}x{k}x{n}_nnz{len(a_val)}x{len(b_val)}", kernels=(kern,),
        inputs=(("A_idx", st.a_idx), ("A_val", np.asarray(a_val, dtype=dtype)),
                ("B_idx", st.b_idx), ("B_val", np.asarray(b_val, dtype=dtype))),
        outputs=(("C_val", (st.nnz,)),), dtype=np.dtype(dtype).name, macs=st.products,
    )
    return run_passes(prog)
