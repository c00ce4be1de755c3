"""Every CUDA kernel compiles to PTX for sm_80 and sm_90 with the real compiler (NVVM).

The simulator runs kernels as Python and accepts code the CUDA compiler rejects; these tests
compile each registered kernel at its launch signature in a subprocess with the simulator off
(numba-cuda cannot compile PTX under NUMBA_ENABLE_CUDASIM=1, and this process runs the
simulator). Two controls show the checks can fail: a kernel sized by a non-constant expression
(runs in the simulator, rejected by the compiler) and one doing float64 arithmetic.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r"""
import json
from numba import cuda, float32
from dataflow.cuda.registry import KernelSpec, compile_all_ptx, compile_ptx

N = 8

def control_local_size(x):  # local array sized by an expression: fine in the simulator only
    acc = cuda.local.array(N // 2, float32)
    acc[0] = x[0]
    x[0] = acc[0]

def control_f64(x):  # 0.1 is a float64: the multiply runs in double precision
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] = x[i] * 0.1

rows = compile_all_ptx(((8, 0), (9, 0)))
rows.append(compile_ptx(KernelSpec("control_local_size", control_local_size,
                                   "void(float32[::1])", ""), (9, 0)))
rows.append(compile_ptx(KernelSpec("control_f64", control_f64, "void(float32[::1])", ""),
                        (9, 0)))
print(json.dumps(rows))
"""


@pytest.fixture(scope="module")
def ptx_rows():
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    return {(r["kernel"], r["cc"]): r for r in rows}


def _registered():
    from dataflow.cuda.registry import kernels

    return kernels()


@pytest.mark.parametrize("cc", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", [k.name for k in _registered()])
def test_kernel_compiles_to_ptx(ptx_rows, name, cc):
    from dataflow.cuda.registry import STATIC_SHARED_LIMIT_BYTES

    row = ptx_rows[(name, cc)]
    assert row["ok"], f"{name} does not compile for {cc}: {row.get('error')}"
    assert row["target"] == cc and row["entry"]
    assert row["shared_bytes"] <= STATIC_SHARED_LIMIT_BYTES
    assert row["f64_instructions"] == 0, f"{name} does float64 arithmetic"


def test_controls_show_the_checks_can_fail(ptx_rows):
    bad = ptx_rows[("control_local_size", "sm_90")]
    assert not bad["ok"] and "local.array" in bad["error"]
    f64 = ptx_rows[("control_f64", "sm_90")]
    assert f64["ok"] and f64["f64_instructions"] > 0


def test_shared_memory_sizes_are_the_declared_tiles(ptx_rows):
    """The PTX's static shared memory is what the tile constants say (4-byte words)."""
    from dataflow.cuda.kernels import butterfly, dense, microtile

    assert ptx_rows[("gemm_tiled", "sm_90")]["shared_bytes"] == 2 * 4 * dense.GEMM_TILE ** 2
    assert ptx_rows[("butterfly_fused[complex64]", "sm_90")]["shared_bytes"] == \
        8 * butterfly.FUSED_TILE_MAX
    assert ptx_rows[("microtile_matmul_m", "sm_90")]["shared_bytes"] == \
        4 * microtile.MT_GK_MAX * (microtile.MT_ROWS + microtile.MT_TN)


def test_every_launched_kernel_is_registered():
    """Dry runs of every host op: each kernel function they launch is in the registry (so it
    is compiled above), at the dtypes the registry lists."""
    from dataflow.cuda import ops
    from dataflow.cuda.runner import Runner

    launched = set()
    real_launch = Runner.launch

    def spy(self, name, fn, grid, block, args, **kw):
        launched.add(fn)
        return real_launch(self, name, fn, grid, block, args, **kw)

    z = np.zeros((64, 64), np.float32)
    pos, crd = np.arange(0, 130, 2), np.tile([0, 1], 64)  # two entries in each of 64 rows
    r = Runner(execute=False)
    Runner.launch = spy
    try:
        ops.gemm(z, z, runner=r)
        ops.spmm(pos, crd, np.ones(128), (64, 64), z, runner=r)
        ops.sddmm(z, z, pos, crd, np.ones(128), runner=r)
        for dt in (np.float32, np.complex64):
            ops.butterfly(np.zeros((2, 2048), dt), np.zeros((11, 1024, 2, 2), dt), runner=r)
        ops.fft(np.zeros(2048, np.complex64), runner=r)
        ops.butterfly_ffn(np.zeros((2, 64), np.float32), np.zeros((6, 32, 2, 2)),
                          np.zeros((6, 32, 2, 2)), np.zeros(64), None, runner=r)
        ops.fnet_attention(np.zeros((64, 32), np.float32), runner=r)
        for fused in (True, False):
            ops.sparse_attention(z, z, z, pos, crd, fused=fused, runner=r)
        ops.sparse_attention(z, z, z, window=4, dilation=2, runner=r)
        for g in ((32, 1), (1, 64)):
            ops.microtile_matmul(z, z, g, runner=r)
        ops.relu_ffn(z, z, np.zeros(64), z, "32x1", runner=r)
        ops.moe(z, z[:, :4], np.zeros(4), np.zeros((4, 64, 16)), 2, runner=r)
    finally:
        Runner.launch = real_launch
    registered = {k.function for k in _registered()}
    missing = [getattr(f, "__name__", f) for f in launched - registered]
    assert not missing, f"kernels launched but not in the registry: {missing}"
