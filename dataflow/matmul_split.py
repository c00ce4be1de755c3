"""gemm and spmm of any size (docs/conventions.md#tiling-any-problem-size).

`split_matmul` is the hook `dataflow.matmul_workloads` calls before it builds the whole
program. It returns None when the problem fits the SPM and the host's memory -- the workload
then runs exactly as it always has -- and otherwise runs it in blocks that fit
(`dataflow.plan.split`): K panels and N blocks when B does not fit the SPM, M tiles generated
one at a time from the seed when the operands do not fit the host's memory. A dense GEMM's
blocks of one shape run identically, so its timing is memoised per shape and its other blocks'
values are computed in numpy with the kernel's semantics (`inorder_matmul`).

CSR operands are drawn by `random_csr` with numpy alone, so a run that fits whole (the default
job) never imports scipy.sparse (about 0.3 s of start-up, issue 14); a split run slices A as a
scipy CSR matrix, and imports scipy.sparse where it builds one (`csr_operand`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from dataflow.arch import ArchSpec
from dataflow.arch.limits import HOST_BYTES_PER_ITERATION
from dataflow.errors import UserError
from dataflow.plan.split import (
    Block,
    Split,
    SplitWork,
    check_limits,
    choose_split,
    fits_spm,
    fits_unsplit,
    inorder_matmul,
    inorder_spmm,
    m_tile_rows,
    round_up,
    run_split,
    splits_k_and_n,
)
from dataflow.ust_frontend.op_base import as_tensor, lower_matmul
from dataflow.workloads import check_host_memory, dense_bytes, fits_host_memory, host_budget


def host_bytes(workload: str, m: int, k: int, n: int, density: float) -> float:
    """Host bytes of the operands and C, twice over, as `make_operands` counts them."""
    a_bytes = dense_bytes((m, k)) if workload == "gemm" else 12 * density * m * k
    return 2 * (a_bytes + dense_bytes((k, n), (m, n)))


def row_words(arch: ArchSpec, workload: str, k: int, n: int, density: float) -> int:
    """SPM words one streamed row of A and C takes (its windows, each with the tiling's spare
    row); for CSR A the values and columns of a dense row (mean + 4 sigma of its nonzeros)."""
    row = arch.spm.words_per_row
    if workload == "gemm":
        a = round_up(k, row) + row
    else:
        mu = density * k
        a = 2 * (round_up(math.ceil(mu + 4 * math.sqrt(mu)) + 1, row) + row)
    return a + round_up(n, row) + row


def sim_bytes(arch: ArchSpec, workload: str, rows: int, k: int, n: int,
              density: float) -> float:
    """Host bytes the mapper and the engine hold to simulate a rows x k x n block: one
    iteration per stored entry of A and vector of C (`HOST_BYTES_PER_ITERATION` each); none
    beyond the operands on a systolic array, whose mapping is analytic."""
    if not splits_k_and_n(arch):
        return 0.0
    stored = k if workload == "gemm" else density * k
    return HOST_BYTES_PER_ITERATION * rows * stored * -(-n // arch.pe_array.simd_lanes)


def _host_rows(arch: ArchSpec, workload: str, k: int, n: int, density: float, kp: int,
               nb: int, operands: float | None) -> int:
    """The most rows of an M tile of kp x nb blocks the host holds: the tile's operands (all of
    them, `operands`, when they are held whole; else the tile's rows and B) and the
    simulation of one block."""
    per_row = sim_bytes(arch, workload, 1, kp, nb, density)
    if operands is None:  # streamed: A's and C's rows of the tile, and B
        per_row += host_bytes(workload, 1, k, n, density) - host_bytes(workload, 0, k, n, density)
        operands = host_bytes(workload, 0, k, n, density)
    return max(0, int((host_budget() - operands) // per_row))


def plan_split(workload: str, arch: ArchSpec, m: int, k: int, n: int,
               density: float = 1.0) -> Split | None:
    """The split of an m x k x n gemm / spmm, or None when it runs whole: B resident and one
    row of A and C fit the SPM, and the operands and their simulation fit the host's memory
    (`sim_bytes`)."""
    operands = host_bytes(workload, m, k, n, density)
    streamed = not fits_host_memory(operands)
    simulable = fits_host_memory(operands + sim_bytes(arch, workload, m, k, n, density))
    cut = splits_k_and_n(arch)
    if simulable and (not cut or fits_unsplit(arch, k * n,
                                              row_words(arch, workload, k, n, density))):
        return None

    def fits(kp: int, nb: int) -> bool:
        return not cut or fits_spm(arch, kp * nb, row_words(arch, workload, kp, nb, density))

    def m_rows(kp: int, nb: int) -> int:
        # as many rows as the host holds (0: not even one; the tile's check says so); a GEMM's
        # tiles, memoised, at most `MIN_TILES` SPM tiles, so its representatives stay small
        host = _host_rows(arch, workload, k, n, density, kp, nb, None if streamed else operands)
        if workload != "gemm":
            return max(1, host)
        rows = m_tile_rows(arch, kp * nb, row_words(arch, workload, kp, nb, density))
        return min(rows, host) if host else rows

    a_bytes = 4 * m * k if workload == "gemm" else 8 * density * m * k
    return choose_split(arch, m, k, n, fits, traffic=(a_bytes, 4 * k * n, 4 * m * n),
                        m_rows=m_rows if workload == "gemm" or not simulable else None,
                        n_align=arch.pe_array.simd_lanes, streamed=streamed, what=workload,
                        issue=None if workload == "gemm" else spmm_issue(arch, m, k, n, density))


#: SPM reads a CSR SpMM issues per nonzero beside its gathers: its value and its column
SCALAR_LOADS_PER_NONZERO = 2


def spmm_issue(arch: ArchSpec, m: int, k: int, n: int, density: float) -> Callable[[int], float]:
    """Cycles a CSR SpMM's nonzeros take to issue in N blocks of `nb` columns
    (docs/conventions.md#spmm-n-blocks-by-issue-slots): each nonzero of a block of v vectors
    loads its value and column and issues v gathers and v MACs, `issue_width` ops a PE a cycle
    (one on a single-issue PE), each unit at most one (docs/architecture.md#issue-width), and
    reads v + 2 SPM rows on the lines' read ports; whichever admits fewer nonzeros a cycle
    binds. A wider block loads each value and column once for more MACs."""
    nnz = density * m * k
    pes, width = arch.pe_array.num_pes, arch.pe_array.issue_width
    ports = arch.spm.lines * arch.spm.read_ports_per_line
    lanes = arch.pe_array.simd_lanes

    def unit_rates(v: int) -> list[float]:
        """Nonzeros a cycle each unit admits (a multi-issue PE only: on a single-issue one
        the slot bound is the tighter)."""
        if width == 1:
            return []
        mac = "macc" if any("macc" in fu.ops for fu in arch.pe_array.functional_units) else "mac"
        busy: dict[str, int] = {}
        for op, count in (("load", SCALAR_LOADS_PER_NONZERO), ("gather", v), (mac, v)):
            fu = arch.fu_for(op)
            busy[fu.name] = busy.get(fu.name, 0) + count * fu.issue_interval_cycles
        return [pes / b for b in busy.values()]

    def block(cols: int) -> float:
        v = -(-cols // lanes)
        loads = SCALAR_LOADS_PER_NONZERO
        return nnz / min(pes * width / (loads + 2 * v), ports / (loads + v), *unit_rates(v))

    def cycles(nb: int) -> float:
        return (n // nb) * block(nb) + (block(n % nb) if n % nb else 0.0)

    return cycles


def random_csr(rows: int, cols: int, density: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indptr, indices, data) of a rows x cols CSR matrix with round(density * rows * cols)
    stored entries at distinct random positions, standard normal fp32 values, columns sorted
    within each row.

    The draws are `scipy.sparse.random(rows, cols, density, random_state=rng, data_rvs=
    standard normal)`'s, in its order (positions without replacement over the column-major
    ravelled index, then the values), so the matrices -- and the documented cycles of the
    default job -- are the ones scipy drew before (`tests/test_startup.py` compares them)."""
    size = int(round(density * rows * cols))
    flat = rng.choice(rows * cols, size=size, replace=False)
    row, col = np.unravel_index(flat, (rows, cols), order="F")
    data = rng.standard_normal(size).astype(np.float32)
    order = np.lexsort((col, row))
    index = np.int32 if max(size, rows, cols) < 2**31 else np.int64  # as scipy picks it
    indptr = np.zeros(rows + 1, index)
    np.cumsum(np.bincount(row, minlength=rows), out=indptr[1:])
    return indptr, col[order].astype(index), data[order]


def csr_operand(indptr: np.ndarray, indices: np.ndarray, data: np.ndarray, shape):
    """A scipy CSR matrix viewing `random_csr`'s arrays (for callers that slice it)."""
    import scipy.sparse as sp  # only here: the unsplit default job needs no scipy (start-up)

    return sp.csr_matrix((data, indices, indptr), shape=shape)


def _sparse(a) -> bool:
    """Whether an operand is spmm's CSR A (a scipy matrix) rather than gemm's dense array."""
    return not isinstance(a, np.ndarray)


def _tile_a(workload: str, rows: int, k: int, density: float, rng):
    """One M tile of A, drawn as `make_operands` draws the whole."""
    if workload == "gemm":
        return rng.standard_normal((rows, k), dtype=np.float32)
    return csr_operand(*random_csr(rows, k, density, rng), shape=(rows, k))


def _a_block(a, blk: Block, k: int):
    if (blk.k0, blk.k1) == (0, k):
        return a
    return a[:, blk.k0:blk.k1] if _sparse(a) else np.ascontiguousarray(a[:, blk.k0:blk.k1])


def _program(ops, blk: Block, k: int):
    a, b = ops
    ab = _a_block(a, blk, k)
    if _sparse(ab) and ab.nnz == 0:
        return None
    return lower_matmul(as_tensor(ab), as_tensor(np.ascontiguousarray(b[blk.k0:blk.k1,
                                                                        blk.n0:blk.n1])))


def _reference(ops, blk: Block) -> np.ndarray:
    a, b = ops
    return np.asarray(a.astype(np.float64) @ b[:, blk.n0:blk.n1].astype(np.float64))


def _memo_key(workload: str):
    """A dense GEMM block's run depends on its shape alone; a CSR one's on its rows of A (its
    M tile and K panel), so N blocks of one width share it."""
    if workload == "gemm":
        return lambda blk: (blk.shape, blk.reloads)
    return lambda blk: (blk.m0, blk.k0, blk.k1, blk.shape[2])


def _values(ops, blk: Block, k: int) -> np.ndarray:
    """A memoised block's product with its kernel's semantics (`inorder_matmul`,
    `inorder_spmm`)."""
    ab, bb = _a_block(ops[0], blk, k), ops[1][blk.k0:blk.k1, blk.n0:blk.n1]
    return inorder_spmm(ab, bb) if _sparse(ab) else inorder_matmul(ab, bb)


def _operands(split: Split, workload: str, density: float, seed: int,
              make_operands: Callable, nnz: list[int]):
    """`operands(m0, m1)` of the split: generated tile by tile when streamed (A's tile from
    `default_rng([seed, m0])`, B from `default_rng(seed)` as a whole generation draws it),
    else rows of the whole operands."""
    m, k, n = split.m, split.k, split.n
    if split.streamed:
        b = np.random.default_rng(seed).standard_normal((k, n), dtype=np.float32)
        whole = None
    else:
        whole, b = make_operands(workload, m, k, n, density, seed)

    def operands(m0: int, m1: int):
        if whole is None:
            a = _tile_a(workload, m1 - m0, k, density, np.random.default_rng([seed, m0]))
        else:
            a = whole if (m0, m1) == (0, m) else whole[m0:m1]
        nnz[0] += a.nnz if _sparse(a) else a.size
        return a, b

    return operands


def matmul_work(split: Split, workload: str, density: float, seed: int,
                make_operands: Callable) -> SplitWork:
    """The `SplitWork` of a gemm / spmm split: its operands, sub-programs (the frontend's
    lowering of each block), references, memo keys and the whole problem's floors."""
    m, k, n = split.m, split.k, split.n
    gemm = workload == "gemm"
    nnz = [0]  # stored entries of A, counted as the tiles are made
    notes = (("streamed: A's M tile from row r is drawn from numpy's default_rng([seed, r]), "
              "B from default_rng(seed) as a whole generation draws it"),) if split.streamed else ()
    return SplitWork(
        workload=workload,
        operands=_operands(split, workload, density, seed, make_operands, nnz),
        program=lambda ops, blk: _program(ops, blk, k), reference=_reference,
        compulsory=(lambda runs: (nnz[0] * n, (1 if gemm else 2) * nnz[0] + k * n, m * n)),
        memo_key=_memo_key(workload), values=lambda ops, blk: _values(ops, blk, k), notes=notes)


def split_matmul(workload: str, spec: ArchSpec, *, engine: str, seed: int, trace: bool,
                 m: int, k: int, n: int, density: float, dataflow: str | None,
                 make_operands: Callable, t0: float):
    """Run gemm / spmm in blocks when it does not fit whole (see the module docstring); None
    when it does, or when a parameter is out of range (`make_operands` says which)."""
    if min(m, k, n) <= 0 or (workload == "spmm" and not 0.0 < density <= 1.0):
        return None
    split = plan_split(workload, spec, m, k, n, density if workload == "spmm" else 1.0)
    if split is None:
        return None
    what = f"{workload} (--m {m} --k {k} --n {n})"
    if trace:
        raise UserError(f"--trace: {what} runs split into tiles; trace a size that fits whole")
    gemm = workload == "gemm"
    macs = m * k * n * (1.0 if gemm else density)
    simulated = (sum(math.prod(s) for s, _ in split.distinct_blocks()) if gemm else macs)
    mt, kp, nb = split.m_tile, split.k_panel, split.n_block
    held = host_bytes(workload, mt if split.streamed else m, k, n, density)
    check_host_memory(f"{workload} {'streamed ' if split.streamed else ''}tile (--m {mt} of {m} "
                      f"--k {k} --n {n}) and its simulation",
                      held + sim_bytes(spec, workload, mt, kp, nb, density))
    check_limits(what, macs, simulated)
    work = matmul_work(split, workload, density, seed, make_operands)
    return run_split(split, work, spec, engine=engine, dataflow=dataflow, t0=t0)
