"""Lowering of frontend ops to `Program`s. The passes, in order, are listed in `PASSES`.

Operands arrive as plain numpy arrays (the frontend has already turned UST tensors into the
level arrays a kernel streams), so this stage never sees a `Tensor` object.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import DFGError, GemmShape, Kernel, Program
from dataflow.dfg.index.lower import index_kernel
from dataflow.dfg.index.tensors import csr, dense

#: the statements today's kernels are instances of (docs/architecture.md#the-generic-lowering)
MATMUL = "C[i,j] += A[i,kk] * B[kk,j]"
SPMM = "C[i,j] += A[i,k] * B[k,j]"


def gemm_kernel(m: int, k: int, n: int, name: str = "gemm") -> Kernel:
    """C[m, n] += A[m, k] * B[k, n]; loops i, j (vectorised), kk innermost: each copy keeps a C
    vector in its accumulator register over kk (output stationary). The generic lowering of
    `MATMUL` over row-major A and B."""
    return index_kernel(MATMUL, {"A": dense((m, k)), "B": dense((k, n))}, name=name)


def spmm_csr_kernel(m: int, k: int, n: int, pos: np.ndarray, name: str = "spmm_csr") -> Kernel:
    """C[i, :] += A.val[p] * B[A.crd[p], :] for p in A.pos[i]..A.pos[i+1] (CSR A, dense B).

    The gather of B's row through A's crd is PIT's SRead; j is vectorised over SIMD lanes and p
    runs innermost so the C vector stays in the accumulator register along the row. The generic
    lowering of `SPMM` over CSR A (the structure `pos` alone) and row-major B."""
    return index_kernel(SPMM, {"A": csr((m, k), pos), "B": dense((k, n))}, name=name)


def _check_2d(name: str, x: np.ndarray) -> None:
    if x.ndim != 2:
        raise DFGError(f"{name} must be a matrix, got shape {x.shape}")


def lower_gemm(a: np.ndarray, b: np.ndarray, dtype=np.float32) -> Program:
    """Dense GEMM program for A (m x k) @ B (k x n)."""
    _check_2d("A", a)
    _check_2d("B", b)
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise DFGError(f"matmul shapes do not agree: A is {m}x{k}, B is {k2}x{n} ({k} != {k2})")
    kern = gemm_kernel(m, k, n)
    prog = Program(
        name=f"gemm_{m}x{k}x{n}", kernels=(kern,),
        inputs=(("A", np.ascontiguousarray(a, dtype=dtype).ravel()),
                ("B", np.ascontiguousarray(b, dtype=dtype).ravel())),
        outputs=(("C", (m, n)),), dtype=np.dtype(dtype).name, macs=m * k * n,
        gemm=GemmShape(m, n, k),
    )
    return run_passes(prog)


def lower_spmm_csr(shape: tuple[int, int], pos: np.ndarray, crd: np.ndarray, val: np.ndarray,
                   b: np.ndarray, dtype=np.float32) -> Program:
    """SpMM program for CSR A (given by its level arrays) @ dense B."""
    _check_2d("B", b)
    m, k = shape
    k2, n = b.shape
    if k != k2:
        raise DFGError(f"matmul shapes do not agree: A is {m}x{k}, B is {k2}x{n} ({k} != {k2})")
    if len(pos) != m + 1 or len(crd) != len(val) or int(pos[-1]) != len(crd):
        raise DFGError(f"malformed CSR operand: pos has {len(pos)} entries for {m} rows, "
                       f"crd {len(crd)}, val {len(val)}, pos[-1] = {int(pos[-1])}")
    kern = spmm_csr_kernel(m, k, n, pos)
    prog = Program(
        name=f"spmm_csr_{m}x{k}x{n}_nnz{len(val)}", kernels=(kern,),
        inputs=(("A_val", np.asarray(val, dtype=dtype)), ("A_crd", np.asarray(crd, dtype=np.int64)),
                ("B", np.ascontiguousarray(b, dtype=dtype).ravel())),
        outputs=(("C", (m, n)),), dtype=np.dtype(dtype).name, macs=len(val) * n,
    )
    return run_passes(prog)


# --- passes -------------------------------------------------------------------------------------

def verify_pass(prog: Program) -> Program:
    prog.verify()
    return prog


def drop_dead_nodes(prog: Program) -> Program:
    """Remove body nodes whose values reach no memory write (`live_kernel`, per kernel)."""
    return dataclasses.replace(prog, kernels=tuple(live_kernel(k) for k in prog.kernels))


def live_kernel(k: Kernel) -> Kernel:
    """`k` without the body nodes whose values reach no memory write (`k` itself when none).

    A loop-carried edge is a dependence like an input: its source is live when its destination
    is. The surviving nodes are renumbered 0..n-1 in order and `Kernel.carried` with them; a
    carried edge whose destination is dead goes with it."""
    live = {n.id for n in k.nodes if n.op.writes_spm}
    while True:
        before = len(live)
        for n in reversed(k.nodes):
            if n.id in live:
                live.update(n.inputs)
        live.update(src for src, dst, _ in k.carried if dst in live)
        if len(live) == before:
            break
    if len(live) == len(k.nodes):
        return k
    remap = {old: new for new, old in enumerate(sorted(live))}
    nodes = tuple(dataclasses.replace(n, id=remap[n.id],
                                      inputs=tuple(remap[i] for i in n.inputs))
                  for n in k.nodes if n.id in live)
    carried = tuple((remap[src], remap[dst], dist) for src, dst, dist in k.carried
                    if dst in live)
    return dataclasses.replace(k, nodes=nodes, carried=carried)


PASSES = (drop_dead_nodes, verify_pass)


def run_passes(prog: Program) -> Program:
    for p in PASSES:
        prog = p(prog)
    return prog
