import dataclasses

import numpy as np
import pytest

from dataflow.dfg import DFGError
from dataflow.dfg.lower import gemm_kernel, lower_gemm, lower_spmm_csr
from dataflow.mapper import MappingError, map_kernel, map_program
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.mapping import Placement
from tests.archs import variant


@pytest.fixture
def km(default_arch):
    return map_kernel(gemm_kernel(8, 8, 16), default_arch)


def test_mapping_is_legal_and_ii_at_least_mii(km, default_arch):
    check_kernel_mapping(km, default_arch)
    assert km.ii >= max(km.res_mii, km.rec_mii)
    assert km.ii == km.mii  # this small kernel reaches its lower bound
    assert km.copies >= 2


def test_verifier_rejects_two_ops_in_one_slot(km, default_arch):
    p0, p1 = km.placements[0], km.placements[1]
    clash = dataclasses.replace(p1, pe=p0.pe, time=p0.time)
    bad = dataclasses.replace(km, placements=(p0, clash) + km.placements[2:])
    with pytest.raises(MappingError, match="holds two ops"):
        check_kernel_mapping(bad, default_arch)


def test_verifier_rejects_link_over_capacity(km, default_arch):
    routed = [r for r in km.routes if r.links]
    r = routed[0]
    bad = dataclasses.replace(km, routes=km.routes + (r,))
    with pytest.raises(MappingError, match="links_per_direction"):
        check_kernel_mapping(bad, default_arch)


def test_verifier_rejects_early_use(km, default_arch):
    r = km.routes[0]
    dst = km.placement_map[(r.copy, r.dst)]
    early = Placement(dst.node, dst.copy, dst.pe, 0, dst.latency)
    bad = dataclasses.replace(km, placements=tuple(early if p is dst else p for p in km.placements))
    with pytest.raises(MappingError):
        check_kernel_mapping(bad, default_arch)


def test_verifier_rejects_instruction_overflow(km):
    tight = variant(**{"pe_array.instruction_entries": 1})
    many = [p for p in km.placements]
    pe = many[0].pe
    bad = dataclasses.replace(km, placements=tuple(
        dataclasses.replace(p, pe=pe, time=i) for i, p in enumerate(many)), ii=len(many))
    with pytest.raises(MappingError, match="instruction_entries"):
        check_kernel_mapping(bad, tight)


def test_workload_too_big_for_spm_names_capacity(tmp_path):
    small = variant(**{"spm.lines": 2, "spm.capacity_words_per_line": 64})
    rng = np.random.default_rng(0)
    prog = lower_spmm_csr((4, 64), np.array([0, 1, 2, 3, 4]), np.array([0, 1, 2, 3]),
                          np.ones(4, np.float32), rng.standard_normal((64, 8), dtype=np.float32))
    with pytest.raises(MappingError,
                       match=r"does not fit the SPM.*spm.lines x spm.capacity_words_per_line"):
        map_program(prog, small)


def test_dfg_too_big_for_array_names_instruction_entries():
    tiny = variant(**{"pe_array.rows": 1, "pe_array.cols": 1, "pe_array.instruction_entries": 2})
    with pytest.raises(MappingError, match="instruction_entries"):
        map_kernel(gemm_kernel(2, 2, 8), tiny)


def test_shapes_that_do_not_agree():
    with pytest.raises(DFGError, match="shapes do not agree"):
        lower_gemm(np.ones((3, 4), np.float32), np.ones((5, 2), np.float32))


def test_tiles_cover_the_domain_and_fit(default_arch):
    rng = np.random.default_rng(0)
    prog = lower_gemm(rng.standard_normal((50, 20), dtype=np.float32),
                      rng.standard_normal((20, 24), dtype=np.float32))
    km = map_program(prog, default_arch).kernels[0]
    assert km.tiles[0].lo == 0 and km.tiles[-1].hi == 50
    assert all(a.hi == b.lo for a, b in zip(km.tiles, km.tiles[1:]))
    assert len(km.tiles) >= 2  # DMA overlaps compute


def test_systolic_array_runs_only_gemm(systolic_arch):
    prog = lower_spmm_csr((2, 2), np.array([0, 1, 2]), np.array([0, 1]), np.ones(2, np.float32),
                          np.ones((2, 8), np.float32))
    with pytest.raises(MappingError, match="runs only dense GEMM"):
        map_program(prog, systolic_arch)
