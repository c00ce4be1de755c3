"""SDDMM of any size (docs/conventions.md#sddmm-of-any-size): a Bᵀ larger than the SPM runs in
column blocks of the mask, values equal to numpy's, cycles above the whole problem's roofline,
and a size that fits runs whole as before."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import scipy.sparse as sp
import yaml

from dataflow.arch import arch_from_dict
from dataflow.testing import values_match
from dataflow.ust_frontend.sddmm_op import Sddmm
from dataflow.ust_frontend.sddmm_split import plan_sddmm_split
from tests.conftest import ARCH_DIR


def _small_spm(preset: str, words_per_line: int):
    d = copy.deepcopy(yaml.safe_load((ARCH_DIR / f"{preset}.yaml").read_text()))
    d["spm"]["capacity_words_per_line"] = words_per_line
    return arch_from_dict(d, source=f"<{preset}, {words_per_line} words per line>")


def _operands(m, n, k, density, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    mask = sp.random(m, n, density=density, format="csr", dtype=np.float32, random_state=rng)
    return a, b, mask


@pytest.mark.parametrize("preset", ["default", "mlx_4x4"])
def test_a_bt_larger_than_the_spm_runs_in_column_blocks(preset):
    arch = _small_spm(preset, 512)  # 4,096 words on 8 lines: Bᵀ of 512 x 16 does not fit
    a, b, mask = _operands(24, 512, 16, 0.05)
    op = Sddmm(a, b, mask)
    plan = op.plan(arch=arch, backend="sim", cache=False)
    assert plan.kernel_mappings == () and "column blocks" in plan.summary
    got = op.execute("sim").entries()[1]
    want = op.execute("numpy").entries()[1]
    assert values_match(got, want)
    res = op.last_result
    assert "column blocks" in res.mapping_summary and res.cycles >= res.roofline_cycles
    blocks = -(-512 // plan_sddmm_split(arch, 16, 512, mask.indptr))
    assert blocks > 1 and len(res.kernels) >= blocks  # one sddmm kernel per block
    # the whole problem's roofline: nnz * k MACs; A, Bᵀ, the mask read once, C written once
    peak = arch.pe_array.num_pes * arch.pe_array.simd_lanes
    assert res.roofline.compute_cycles == pytest.approx(mask.nnz * 16 / peak)


def test_a_size_that_fits_runs_whole():
    arch = _small_spm("mlx_4x4", 512)
    a, b, mask = _operands(24, 128, 16, 0.05)  # Bᵀ 2,048 words
    assert plan_sddmm_split(arch, 16, 128, mask.indptr) is None
    op = Sddmm(a, b, mask)
    assert op.plan(arch=arch, backend="sim", cache=False).kernel_mappings
    assert values_match(op.execute("sim").entries()[1], op.execute("numpy").entries()[1])


def test_the_benchmark_size_is_split_on_mlx_only():
    """m = n = 4096, k = 64 at 1 %: Bᵀ is 262,144 words, the MLX SPM 131,072 (the row the
    roofline benchmark refused); default.yaml's 1,048,576 hold it whole."""
    rng = np.random.default_rng(0)
    pos = np.concatenate(([0], np.cumsum(rng.binomial(4096, 0.01, size=4096))))
    mlx = arch_from_dict(yaml.safe_load((ARCH_DIR / "mlx_4x4.yaml").read_text()))
    default = arch_from_dict(yaml.safe_load((ARCH_DIR / "default.yaml").read_text()))
    assert plan_sddmm_split(mlx, 64, 4096, pos) == 1024  # 4 blocks, half the SPM each
    assert plan_sddmm_split(default, 64, 4096, pos) is None
