"""Every CUDA kernel with the signatures it is launched with, so one check compiles them all.

The CUDA simulator runs Python semantics and accepts code the real compiler rejects (untyped
globals, Python objects, float64 where float32 is meant ...). `compile_all_ptx` compiles each
entry to PTX for the given compute capabilities with numba-cuda's NVVM, which needs no GPU but
does need the simulator off: run it in a process without NUMBA_ENABLE_CUDASIM
(`python -m dataflow.cuda.registry --cc 80 --cc 90` prints one JSON line per kernel).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass

from dataflow.cuda.device import cuda_module

# Deferred imports: numba.cuda is imported after `device.cuda_module()` has chosen GPU or simulator.

F32_2D = "float32[:, ::1]"
C64_2D = "complex64[:, ::1]"
I32_1D = "int32[::1]"
I32_2D = "int32[:, ::1]"
I64_1D = "int64[::1]"

#: Static shared memory a block may use without opting in (48 KiB on sm_80 and sm_90).
STATIC_SHARED_LIMIT_BYTES = 48 * 1024


@dataclass(frozen=True)
class KernelSpec:
    """One kernel at one signature. `function` is the plain Python function."""

    name: str
    function: Callable
    signature: str
    what: str


def kernels() -> tuple[KernelSpec, ...]:
    """All kernels of `dataflow.cuda`, each at every signature the launchers use."""
    if "numba.cuda" not in sys.modules:  # let the device module pick GPU or simulator first

        cuda_module()
    from dataflow.cuda.kernels import attention, butterfly, dense, microtile, moe, sparse

    sc = "int64"
    return (
        KernelSpec("gemm_tiled", dense.gemm_tiled,
                   f"void({F32_2D}, {F32_2D}, {F32_2D}, {sc}, {sc}, {sc})",
                   "dense GEMM tiled in shared memory"),
        KernelSpec("spmm_csr", sparse.spmm_csr,
                   f"void({I32_1D}, {I32_1D}, float32[::1], {F32_2D}, {F32_2D}, {sc}, {sc})",
                   "CSR SpMM, one thread per output"),
        KernelSpec("sddmm_csr", sparse.sddmm_csr,
                   f"void({F32_2D}, {F32_2D}, {I32_1D}, {I32_1D}, float32[::1], float32[::1], "
                   f"{sc}, {sc})",
                   "SDDMM over CSR, one thread per stored entry"),
        KernelSpec("butterfly_stage[float32]", butterfly.butterfly_stage,
                   f"void({F32_2D}, {F32_2D}, float32[:, :, ::1], {sc}, {sc}, {sc})",
                   "one butterfly stage, real"),
        KernelSpec("butterfly_stage[complex64]", butterfly.butterfly_stage,
                   f"void({C64_2D}, {C64_2D}, complex64[:, :, ::1], {sc}, {sc}, {sc})",
                   "one butterfly stage, complex (FFT)"),
        KernelSpec("butterfly_fused[float32]", butterfly.butterfly_fused_f32,
                   f"void({F32_2D}, {F32_2D}, float32[:, :, :, ::1], {I64_1D}, {sc}, {sc})",
                   "stages fused in shared memory, real"),
        KernelSpec("butterfly_fused[complex64]", butterfly.butterfly_fused_c64,
                   f"void({C64_2D}, {C64_2D}, complex64[:, :, :, ::1], {I64_1D}, {sc}, {sc})",
                   "stages fused in shared memory, complex (FFT)"),
        KernelSpec("bit_reverse[complex64]", butterfly.bit_reverse,
                   f"void({C64_2D}, {C64_2D}, {sc}, {sc})", "bit-reversal permutation (FFT)"),
        KernelSpec("bias_relu", butterfly.bias_relu,
                   f"void({F32_2D}, float32[::1], boolean, {sc}, {sc})",
                   "bias add and ReLU after a butterfly linear layer"),
        KernelSpec("transpose[complex64]", butterfly.transpose,
                   f"void({C64_2D}, {C64_2D}, {sc}, {sc})",
                   "shared-memory tiled transpose (2-D FFT corner turn)"),
        KernelSpec("csr_row_softmax", attention.csr_row_softmax,
                   f"void({I32_1D}, float32[::1], float32[::1], {sc})",
                   "softmax over each CSR row's stored entries"),
        KernelSpec("attention_fused", attention.attention_fused,
                   f"void({F32_2D}, {F32_2D}, {F32_2D}, {I32_1D}, {I32_1D}, {F32_2D}, float32, "
                   f"{sc}, {sc}, {sc}, {sc})",
                   "sparse attention, scores + online softmax + SpMM in one kernel"),
        KernelSpec("microtile_flags", microtile.microtile_flags,
                   f"void({F32_2D}, uint8[:, ::1], {sc}, {sc}, {sc}, {sc}, {sc})",
                   "nonzero micro-tiles of A (run-time index, step 1)"),
        KernelSpec("compact_flags", microtile.compact_flags,
                   f"void(uint8[:, ::1], {I32_2D}, {I32_1D}, {sc}, {sc})",
                   "flags -> index lists (run-time index, step 2)"),
        KernelSpec("microtile_matmul_k", microtile.microtile_matmul_k,
                   f"void({F32_2D}, {F32_2D}, {F32_2D}, {I32_2D}, {I32_1D}, {sc}, {sc}, {sc}, "
                   f"{sc}, {sc})",
                   "gather nonzero k micro-tiles (32x1, 32x64) into dense tiles"),
        KernelSpec("microtile_matmul_m", microtile.microtile_matmul_m,
                   f"void({F32_2D}, {F32_2D}, {F32_2D}, {I32_2D}, {I32_1D}, {sc}, {sc}, {sc})",
                   "gather nonzero rows per k-block (1x64), scatter-add results"),
        KernelSpec("moe_topk", moe.moe_topk,
                   f"void({F32_2D}, {I32_2D}, {F32_2D}, {sc}, {sc}, {sc})",
                   "MoE top-k gating and gate softmax, one thread per token"),
        KernelSpec("moe_dispatch_index", moe.moe_dispatch_index,
                   f"void({I32_2D}, {I32_1D}, {I32_1D}, {I32_2D}, {sc}, {sc}, {sc})",
                   "MoE dispatch layout: expert offsets and each row's token"),
        KernelSpec("moe_gather", moe.moe_gather,
                   f"void({F32_2D}, {I32_1D}, {F32_2D}, {sc}, {sc})",
                   "MoE dispatch: gather token rows by expert"),
        KernelSpec("moe_expert_gemm", moe.moe_expert_gemm,
                   f"void({F32_2D}, float32[:, :, ::1], {F32_2D}, {I32_1D}, {sc}, {sc})",
                   "all experts' GEMMs in one launch (grouped, tiled in shared memory)"),
        KernelSpec("moe_combine", moe.moe_combine,
                   f"void({F32_2D}, {F32_2D}, {I32_2D}, {F32_2D}, {sc}, {sc}, {sc})",
                   "MoE combine: gate-weighted sum of each token's expert rows"),
    )


def _shared_bytes(ptx: str) -> int:
    """Static shared memory the PTX declares (sum of `.shared .align A .b8 name[N]`)."""
    return sum(int(n) for n in re.findall(r"\.shared\s+\.align\s+\d+\s+\.b8\s+\S+\[(\d+)\]", ptx))


def compile_ptx(spec: KernelSpec, cc: tuple[int, int]) -> dict:
    """Compile one kernel to PTX; a dict with ok, the target line, shared bytes or the error."""
    from numba import cuda
    from numba.cuda.core import config

    if config.ENABLE_CUDASIM:
        raise RuntimeError("PTX compilation needs the CUDA simulator off: run it in a process "
                           "without NUMBA_ENABLE_CUDASIM=1")
    out = {"kernel": spec.name, "cc": f"sm_{cc[0]}{cc[1]}", "signature": spec.signature}
    try:
        ptx, _ = cuda.compile_ptx(spec.function, spec.signature, cc=cc)
    except Exception as exc:  # noqa: BLE001 - any compiler error is this kernel's result
        out.update(ok=False, error=f"{type(exc).__name__}: {exc}")
        return out
    target = re.search(r"^\.target\s+(\S+)", ptx, re.MULTILINE)
    # fp64 arithmetic in an fp32 kernel (a Python float constant, math.inf, ...) runs at 1/64
    # of the fp32 rate on many GPUs: the simulator hides it, the PTX shows it
    f64 = len(re.findall(r"^\s*[a-z][\w.]*\.f64\b", ptx, re.MULTILINE))
    out.update(ok=True, target=target.group(1) if target else None,
               entry=".entry" in ptx, shared_bytes=_shared_bytes(ptx), f64_instructions=f64,
               ptx_chars=len(ptx))
    return out


def compile_all_ptx(ccs=((8, 0), (9, 0))) -> list[dict]:
    """Every registered kernel compiled for every compute capability in `ccs` (a process
    without NUMBA_ENABLE_CUDASIM; numba.cuda is imported here, in compiler mode, first)."""
    from numba import cuda  # noqa: F401  (before kernels() could switch the simulator on)

    return [compile_ptx(spec, cc) for spec in kernels() for cc in ccs]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dataflow.cuda.registry",
                                description="compile every CUDA kernel to PTX")
    p.add_argument("--cc", action="append", default=None,
                   help="compute capability like 80 or 90 (repeatable; default 80 and 90)")
    args = p.parse_args(argv)
    ccs = [(int(c[:-1]), int(c[-1])) for c in (args.cc or ["80", "90"])]
    ok = True
    for row in compile_all_ptx(ccs):
        ok &= row["ok"]
        print(json.dumps(row), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
