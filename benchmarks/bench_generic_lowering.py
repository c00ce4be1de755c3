"""Formats on the generic lowering against converting to CSR (issue 13 point 1).

For each UST format of a sparse A, C = A @ B runs two ways through the compiler and the fast
engine, side by side in this run: (1) as the frontend did before, A converted to CSR (host
work, not counted) and the hand-written CSR SpMM; (2) the generic lowering of
`C[i,j] += A[i,k] * B[k,j]` over A's own levels (dataflow/dfg/index), in its default loop order
and in the concordant one (A's levels outermost first), and (3) what the frontend now runs
(`lower_matmul`: the generic path where it is routed, else CSR). Values are checked against numpy on
every run. The frontend routes a format to the generic path where it is at least as fast
(`dataflow.ust_frontend.index_operands.generic_matmul`: diagonal and block-row formats).

    python benchmarks/bench_generic_lowering.py [--m 1024] [--quick]

Prints a table (cycles, generic / CSR) and writes benchmarks/out/bench_generic_lowering.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from dataflow.arch import load_arch
from dataflow.dfg.index import tensors as T
from dataflow.dfg.index.lower import CONCORDANT
from dataflow.dfg.index.program import index_program
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan.compile import choose_schedule
from dataflow.testing import values_match
from dataflow.ust_frontend.index_operands import tensor_levels
from dataflow.ust_frontend.named import NamedFormats as NF
from dataflow.ust_frontend.op_base import lower_matmul
from dataflow.ust_frontend.tensor import Tensor

OUT = HERE / "out"
MM = "C[i,j] += A[i,k] * B[k,j]"


def patterns(m: int) -> dict[str, np.ndarray]:
    """0/1 patterns: random at 1 %, a five-diagonal band, 4 x 4 blocks at 2 %."""
    rand = sp.random(m, m, density=0.01, random_state=1).toarray() != 0
    band = sp.diags([np.ones(m - abs(o)) for o in range(-2, 3)], list(range(-2, 3)),
                    shape=(m, m)).toarray() != 0
    blocks = np.kron(sp.random(m // 4, m // 4, density=0.02, random_state=2).toarray() != 0,
                     np.ones((4, 4), bool))
    return {"random": rand, "band": band, "blocks": blocks}


CASES = (("CSC", NF.CSC, "random"), ("COO", NF.COO, "random"), ("DCSR", NF.DCSR, "random"),
         ("BSR 4x4", NF.BSR((4, 4)), "blocks"), ("DIAI", NF.DIAI, "band"),
         ("DIA (scipy)", NF.DIAJ, "band"))


def cycles(program, want, arch) -> int:
    mapping, _ = choose_schedule(program, arch)
    res = simulate_mapping(mapping, engine="fast")
    if not values_match(np.asarray(res.output).reshape(want.shape), want):
        raise AssertionError(f"{program.name}: values differ from numpy")
    return res.cycles


def run_case(name, fmt, pat, n, arch, rng) -> dict:
    m = pat.shape[0]
    a = (pat * rng.standard_normal(pat.shape)).astype(np.float32)
    b = rng.standard_normal((m, n)).astype(np.float32)
    want = a.astype(np.float64) @ b
    csr = sp.csr_matrix(a)
    csr.sort_indices()
    row = {"format": name, "n": n, "csr": cycles(lower_spmm_csr((m, m), csr.indptr,
                                                                csr.indices, csr.data, b),
                                                 want, arch)}
    tensor = Tensor.from_dense(a, fmt)
    row["frontend"] = cycles(lower_matmul(tensor, Tensor.from_dense(b)), want, arch)
    levels = tensor_levels(tensor)
    tensors = {"A": levels, "B": T.dense((m, n), val=b)}
    for label, order in (("default", None), ("concordant", CONCORDANT)):
        try:
            prog = index_program(MM, tensors, order=order, name="generic", macs=csr.nnz * n)
            row[label] = cycles(prog, want, arch)
        except ValueError as e:  # a DFGError: the format's filler runs past the edges
            row[label] = f"refused: {str(e)[:60]}"
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=1024)
    ap.add_argument("--quick", action="store_true", help="m = 256")
    args = ap.parse_args()
    m = 256 if args.quick else args.m
    arch = load_arch(HERE.parent / "arch_configs" / "default.yaml")
    rng = np.random.default_rng(0)
    pats = patterns(m)
    print(f"# generic lowering vs CSR, m = k = {m}, default.yaml; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores")
    print(f"{'format':12s} {'n':>3s} {'CSR':>8s} {'default':>18s} {'concordant':>18s} "
          f"{'frontend':>18s}")
    rows = []
    for n in (1, 16):
        for name, fmt, pat in CASES:
            row = run_case(name, fmt, pats[pat], n, arch, rng)
            rows.append(row)
            cells = [f"{row[k]:8d} ({row[k] / row['csr']:4.2f}x)" if isinstance(row[k], int)
                     else f"{'refused':>18s}" for k in ("default", "concordant", "frontend")]
            print(f"{name:12s} {n:3d} {row['csr']:8d} " + " ".join(f"{c:>18s}" for c in cells),
                  flush=True)
    OUT.mkdir(exist_ok=True)
    (OUT / "bench_generic_lowering.json").write_text(json.dumps({"m": m, "rows": rows},
                                                                 indent=1))


if __name__ == "__main__":
    main()
