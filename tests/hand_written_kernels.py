"""The kernels as they were written by hand before the generic lowering (`dataflow.dfg.index`)
built them, kept verbatim as the fixed point of tests/test_generic_lowering.py: the generic
lowering of each statement and format must give exactly these kernels (cycles and the
compiler's schedules unchanged)."""

from __future__ import annotations

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node
from dataflow.dfg.index.merge import KINDS, Coiteration
from dataflow.dfg.ops import Op


def gemm_kernel(m: int, k: int, n: int, name: str = "gemm") -> Kernel:
    """C[m, n] += A[m, k] * B[k, n]; loops i, j (vectorised), kk innermost: each copy keeps a C
    vector in its accumulator register over kk (output stationary)."""
    nodes = (
        Node(0, Op.LOAD, buffer="A", addr=Addr((("i", k), ("kk", 1))), name="a"),
        Node(1, Op.LOAD, buffer="B", addr=Addr((("kk", n), ("j", 1))), name="b"),
        Node(2, Op.MUL, (0, 1), name="a*b"),
        Node(3, Op.ACC, (2,), buffer="C", addr=Addr((("i", n), ("j", 1))), name="C+="),
    )
    return Kernel(
        name=name,
        loops=(Loop("i", m), Loop("j", n), Loop("kk", k)),
        nodes=nodes,
        buffers=(Buffer("A", m * k), Buffer("B", k * n), Buffer("C", m * n, "output")),
        vector_var="j",
        carried=((3, 3, 1),),  # the accumulator register
    )


def spmm_csr_kernel(m: int, k: int, n: int, pos: np.ndarray, name: str = "spmm_csr") -> Kernel:
    """C[i, :] += A.val[p] * B[A.crd[p], :] for p in A.pos[i]..A.pos[i+1] (CSR A, dense B).

    The gather of B's row through A's crd is PIT's SRead; j is vectorised over SIMD lanes and p
    runs innermost so the C vector stays in the accumulator register along the row."""
    nnz = int(pos[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="A_val", addr=Addr((("p", 1),)), name="val"),
        Node(1, Op.LOAD, buffer="A_crd", addr=Addr((("p", 1),)), name="crd"),
        Node(2, Op.GATHER, (1,), buffer="B", addr=Addr((("j", 1),), index_stride=n), name="B[crd]"),
        Node(3, Op.MUL, (0, 2), name="val*b"),
        Node(4, Op.ACC, (3,), buffer="C", addr=Addr((("i", n), ("j", 1))), name="C+="),
    )
    return Kernel(
        name=name,
        loops=(Loop("i", m), Loop("j", n), Loop("p", pos="A_pos", parent="i")),
        nodes=nodes,
        buffers=(Buffer("A_val", nnz), Buffer("A_crd", nnz), Buffer("B", k * n),
                 Buffer("C", m * n, "output")),
        vector_var="j",
        carried=((4, 4, 1),),
        domain_arrays=(("A_pos", np.asarray(pos, dtype=np.int64)),),
    )


def sddmm_csr_kernel(m: int, k: int, n: int, pos: np.ndarray, name: str = "sddmm_csr") -> Kernel:
    nnz = int(pos[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="M_val", addr=Addr((("p", 1),)), name="mval"),
        Node(1, Op.LOAD, buffer="M_crd", addr=Addr((("p", 1),)), name="crd"),
        Node(2, Op.LOAD, buffer="A", addr=Addr((("i", k), ("kk", 1))), name="a"),
        Node(3, Op.GATHER, (1,), buffer="BT", addr=Addr((("kk", 1),), index_stride=k),
             name="BT[crd]"),
        Node(4, Op.MUL, (2, 3), name="a*b"),
        Node(5, Op.MUL, (4, 0), name="*mval"),
        Node(6, Op.ACC, (5,), buffer="C_val", addr=Addr((("p", 1),)), name="C+="),
    )
    return Kernel(
        name=name,
        loops=(Loop("i", m), Loop("p", pos="M_pos", parent="i"), Loop("kk", k)),
        nodes=nodes,
        buffers=(Buffer("M_val", nnz), Buffer("M_crd", nnz), Buffer("A", m * k),
                 Buffer("BT", n * k), Buffer("C_val", nnz, "output")),
        carried=((6, 6, 1),),
        domain_arrays=(("M_pos", np.asarray(pos, dtype=np.int64)),),
    )


def dense_elementwise_kernel(kind: str, r: int, c: int) -> Kernel:
    """C[i, j] = A[i, j] op B[i, j], j vectorised over the SIMD lanes."""
    here = Addr((("i", c), ("j", 1)))
    nodes = (
        Node(0, Op.LOAD, buffer="A", addr=here, name="a"),
        Node(1, Op.LOAD, buffer="B", addr=here, name="b"),
        Node(2, KINDS[kind], (0, 1), name=kind),
        Node(3, Op.STORE, (2,), buffer="C", addr=here, name="C="),
    )
    return Kernel(name=f"{kind}_dense", loops=(Loop("i", r), Loop("j", c)), nodes=nodes,
                  buffers=(Buffer("A", r * c), Buffer("B", r * c), Buffer("C", r * c, "output")),
                  vector_var="j")


def coiteration_kernel(kind: str, co: Coiteration, dense: tuple[bool, bool], sizes: tuple[int, int],
                       sparse_output: bool) -> Kernel:
    """for i, for p in S.pos[i]..S.pos[i+1]: C(p) = A(p) op B(p), each operand read along S
    directly, through crd (dense operand) or through its position map (sparse operand)."""
    r, c = co.shape
    nodes: list[Node] = []
    buffers: list[Buffer] = []
    crd_id: list[int] = []

    def add(op, inputs=(), **kw) -> int:
        nodes.append(Node(len(nodes), op, tuple(inputs), **kw))
        return len(nodes) - 1

    def crd() -> int:
        # one load per use: with one crd load feeding both the gather and the scatter the
        # default 8x8 arch got II = 2 after a long route search; two loads map at II = 1
        if not crd_id:
            buffers.append(Buffer("S_crd", co.nnz))
        crd_id.append(add(Op.LOAD, buffer="S_crd", addr=Addr((("p", 1),)), name="crd"))
        return crd_id[-1]

    at_p = Addr((("p", 1),))
    vals = []
    for x, is_dense, mp, size in zip("AB", dense, co.maps, sizes):
        if is_dense and co.full:
            vals.append(add(Op.LOAD, buffer=x, addr=at_p, name=x.lower()))
        elif is_dense:
            vals.append(add(Op.GATHER, (crd(),), buffer=x, addr=Addr((("i", c),), index_stride=1),
                            name=f"{x}[i, crd]"))
        elif mp is None:
            vals.append(add(Op.LOAD, buffer=x, addr=at_p, name=x.lower()))
        else:
            idx = add(Op.LOAD, buffer=f"{x}_map", addr=at_p, name=f"{x}_map")
            buffers.append(Buffer(f"{x}_map", co.nnz))
            vals.append(add(Op.GATHER, (idx,), buffer=x, addr=Addr(index_stride=1),
                            name=f"{x}[map]"))
        buffers.append(Buffer(x, size))
    out = add(KINDS[kind], vals, name=kind)
    if sparse_output:
        add(Op.STORE, (out,), buffer="C", addr=at_p, name="C.val=")
        buffers.append(Buffer("C", co.nnz, "output"))
    elif co.full:
        add(Op.STORE, (out,), buffer="C", addr=at_p, name="C=")
        buffers.append(Buffer("C", r * c, "output"))
    else:  # dense result of a sparse pattern: scatter into the zeroed C
        add(Op.SCATTER, (crd(), out), buffer="C", addr=Addr((("i", c),), index_stride=1),
            name="C[i, crd]=")
        buffers.append(Buffer("C", r * c, "output"))
    return Kernel(name=f"{kind}_coiterate",
                  loops=(Loop("i", r), Loop("p", pos="S_pos", parent="i")),
                  nodes=tuple(nodes), buffers=tuple(buffers),
                  domain_arrays=(("S_pos", co.pos),))


def sddmm_csr_vector_kernel(m: int, k: int, n: int, pos: np.ndarray, lanes: int,
                            name: str = "sddmm_csr_vector") -> Kernel:
    """Pattern-only SDDMM with the reduction vectorised: C[p] = sum over chunks c of
    vsum(A[i, c*lanes : (c+1)*lanes] * B^T[M.crd[p], c*lanes : (c+1)*lanes]).

    `k` must be a multiple of `lanes` (pad A and B^T with zero columns). Each chunk is one SIMD
    multiply and one lane sum (vsum); the scalar accumulator holds C[p] over the chunks, so the
    reduction runs `lanes` MACs per iteration instead of one as in `sddmm_csr_kernel`."""
    if k % lanes:
        raise DFGError(f"sddmm_csr_vector_kernel: k={k} must be a multiple of lanes={lanes}")
    nnz = int(pos[-1])
    nodes = (
        Node(0, Op.LOAD, buffer="M_crd", addr=Addr((("p", 1),)), name="crd"),
        Node(1, Op.LOAD, buffer="A", addr=Addr((("i", k), ("c", lanes), ("l", 1))), name="a"),
        Node(2, Op.GATHER, (0,), buffer="BT", addr=Addr((("c", lanes), ("l", 1)), index_stride=k),
             name="BT[crd]"),
        Node(3, Op.MUL, (1, 2), name="a*b"),
        Node(4, Op.VSUM, (3,), name="sum lanes"),
        Node(5, Op.ACC, (4,), buffer="C_val", addr=Addr((("p", 1),)), name="C+="),
    )
    return Kernel(
        name=name,
        loops=(Loop("i", m), Loop("p", pos="M_pos", parent="i"), Loop("c", k // lanes),
               Loop("l", lanes)),
        nodes=nodes,
        buffers=(Buffer("M_crd", nnz), Buffer("A", m * k), Buffer("BT", n * k),
                 Buffer("C_val", nnz, "output")),
        vector_var="l",
        carried=((5, 5, 1),),
        domain_arrays=(("M_pos", np.asarray(pos, dtype=np.int64)),),
    )
