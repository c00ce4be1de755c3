"""SpMM N blocks by issue slots (docs/conventions.md#spmm-n-blocks-by-issue-slots): where a CSR
SpMM is split, its N blocks are chosen by the cycles the array's issue slots need as well as by
the bytes the DRAM moves. Values equal numpy, cycles never below the roofline, and on mlx_4x4
the wider blocks run faster than the split that moves the fewest bytes. The mechanism is
tested on mlx_4x4 with single-issue PEs (`pe_array.issue_width` 1, where the issue slots bind);
the preset's own issue width 4 (docs/architecture.md#issue-width) has its closed form here too."""

import dataclasses

import pytest

from dataflow import api, matmul_split
from dataflow.arch import resolve_arch
from dataflow.matmul_split import plan_split, spmm_issue

MLX4 = resolve_arch("mlx_4x4")
MLX = dataclasses.replace(MLX4, pe_array=dataclasses.replace(MLX4.pe_array, issue_width=1))
DEFAULT = resolve_arch("default")
SIZE = {"m": 2048, "k": 2048, "n": 64, "density": 0.02}


def _bytes_only(monkeypatch):
    monkeypatch.setattr(matmul_split, "spmm_issue", lambda *a: None)


def test_issue_cycles_fall_with_wider_blocks_until_the_ports_bind():
    m, k, n, d = 4096, 4096, 64, 0.01
    nnz = d * m * k
    mlx = spmm_issue(MLX, m, k, n, d)
    # 16 PEs: a nonzero of v vectors issues 2 loads, v gathers and v MACs
    assert mlx(64) == pytest.approx(nnz / (16 / 18))
    assert mlx(32) == pytest.approx(2 * nnz / (16 / 10))
    assert mlx(64) < mlx(32) < mlx(16) < mlx(8)
    assert mlx(24) == pytest.approx(2 * nnz / (16 / 8) + nnz / (16 / 6))  # 24 + 24 + 16
    # default: 64 PEs, 32 read ports: 10 reads a nonzero bind at 3.2 nonzeros a cycle
    assert spmm_issue(DEFAULT, m, k, n, d)(64) == pytest.approx(nnz / 3.2)


def test_issue_cycles_at_issue_width_four():
    """4 ops a PE a cycle, one per unit: the lsu (2 loads + v gathers a nonzero) and the read
    ports (v + 2 rows) bind, not the 2 + 2v slots."""
    m, k, n, d = 4096, 4096, 64, 0.01
    nnz = d * m * k
    mlx4 = spmm_issue(MLX4, m, k, n, d)
    assert mlx4(64) == pytest.approx(nnz / (16 / 10))
    assert mlx4(32) == pytest.approx(2 * nnz / (16 / 6))
    assert mlx4(64) < mlx4(32) < spmm_issue(MLX, m, k, n, d)(32)


def test_issue_slots_choose_wider_n_blocks_on_mlx(monkeypatch):
    wide = plan_split("spmm", MLX, 4096, 4096, 64, 0.01)
    assert (wide.n_block, wide.counts) == (64, (1, 4, 1))
    _bytes_only(monkeypatch)
    fewest_bytes = plan_split("spmm", MLX, 4096, 4096, 64, 0.01)
    assert (fewest_bytes.n_block, fewest_bytes.counts) == (32, (1, 2, 2))
    # a problem that fits whole is not split either way
    assert plan_split("spmm", DEFAULT, 4096, 4096, 64, 0.01) is None


@pytest.fixture(scope="module")
def runs():
    """(issue slots, fewest bytes) runs of a CSR SpMM that mlx_4x4 splits."""
    out = []
    for issue in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not issue:
                _bytes_only(mp)
            out.append(api.simulate("spmm", MLX, **SIZE))
    return out


def test_issue_split_values_roofline_and_fewer_cycles(runs):
    wide, narrow = runs
    for r in runs:
        assert r.values_match_reference
        assert r.cycles >= r.roofline_cycles
    assert "N block(s) of 64 columns" in wide.mapping_summary
    assert "N block(s) of 32 columns" in narrow.mapping_summary
    assert wide.roofline_cycles == narrow.roofline_cycles
    assert wide.cycles < 0.95 * narrow.cycles
