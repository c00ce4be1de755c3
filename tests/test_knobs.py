"""Every ArchSpec knob moves the result the way the hardware would (one test per knob).

Each test changes one field of the default architecture, keeps everything else (including the
mapper's copy count where the knob should not change it), and asserts the direction of the
change — strictly, on a case chosen so the knob binds.
"""

import dataclasses

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import gemm_kernel, lower_gemm, lower_spmm_csr, run_passes
from dataflow.dfg.ops import Op
from dataflow.mapper import MappingError, map_kernel, map_program
from dataflow.mapper.schedule import hop_distance
from dataflow.pe_array.simulate import simulate_mapping
from tests.archs import variant
from tests.programs import random_program


def _gemm(m=16, k=8, n=16, seed=0):
    rng = np.random.default_rng(seed)
    return lower_gemm(rng.standard_normal((m, k), dtype=np.float32),
                      rng.standard_normal((k, n), dtype=np.float32))


def _spmm(m=32, k=32, n=8, density=0.2, seed=0):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    a.sort_indices()
    return lower_spmm_csr(a.shape, a.indptr, a.indices, a.data,
                          rng.standard_normal((k, n), dtype=np.float32))


def _diag_spmm():
    """Gathers of B rows i and i + 16 from two copies: they share a line when lines divide 16."""
    m = 32
    rng = np.random.default_rng(0)
    a = sp.identity(m, dtype=np.float32, format="csr")
    return lower_spmm_csr(a.shape, a.indptr, a.indices, a.data,
                          rng.standard_normal((m, 8), dtype=np.float32))


def _scale_store(m=16, n=64):
    """C[i, j] = 2 * A[i, j]: one row write per iteration (a write-port-bound stream)."""
    rng = np.random.default_rng(0)
    nodes = (Node(0, Op.LOAD, buffer="A", addr=Addr((("i", n), ("j", 1)))),
             Node(1, Op.CONST, value=2.0),
             Node(2, Op.MUL, (0, 1)),
             Node(3, Op.STORE, (2,), buffer="C", addr=Addr((("i", n), ("j", 1)))))
    k = Kernel("scale", (Loop("i", m), Loop("j", n)), nodes,
               (Buffer("A", m * n), Buffer("C", m * n, "output")), vector_var="j")
    prog = Program("scale", (k,), (("A", rng.standard_normal(m * n).astype(np.float32)),),
                   (("C", (m, n)),))
    return run_passes(prog)


def run(arch, prog, **options):
    mapping = map_program(prog, arch, **options)
    return mapping, simulate_mapping(mapping)


# --- SPM ---------------------------------------------------------------------------------------

def test_more_read_ports_fewer_conflicts():
    res = [run(variant(**{"spm.read_ports_per_line": p, "spm.lines": 8}), _diag_spmm(),
               copies=2, max_tile_rows=32)[1] for p in (1, 2)]
    assert res[0].stall_cycles_spm_conflict > 0
    assert res[1].stall_cycles_spm_conflict < res[0].stall_cycles_spm_conflict
    assert res[1].cycles < res[0].cycles


def test_more_write_ports_fewer_conflicts():
    res = [run(variant(**{"spm.write_ports_per_line": p, "spm.lines": 2}), _scale_store(),
               copies=8)[1] for p in (1, 4)]
    assert res[0].stall_cycles_spm_conflict > res[1].stall_cycles_spm_conflict
    assert res[1].compute_cycles < res[0].compute_cycles


def test_more_lines_fewer_conflicts():
    res = [run(variant(**{"spm.read_ports_per_line": 1, "spm.lines": lines}), _spmm(),
               copies=4)[1] for lines in (2, 16)]
    assert res[1].stall_cycles_spm_conflict < res[0].stall_cycles_spm_conflict


def test_address_mapping_blocked_piles_streams_on_one_line():
    """Interleaved spreads consecutive rows over lines; blocked keeps a buffer on one line, so
    the copies' streams meet there."""
    kw = {"spm.capacity_words_per_line": 4096, "spm.read_ports_per_line": 1}
    inter = run(variant(**kw), _gemm(), copies=8)[1]
    blocked = run(variant(**kw, **{"spm.address_mapping": "blocked"}), _gemm(), copies=8)[1]
    assert blocked.stall_cycles_spm_conflict > inter.stall_cycles_spm_conflict
    assert np.count_nonzero(blocked.spm_reads_per_line) < np.count_nonzero(inter.spm_reads_per_line)


def test_longer_spm_latency_longer_schedule():
    a = run(variant(), _gemm(), copies=4)
    b = run(variant(**{"spm.access_latency_cycles": 5}), _gemm(), copies=4)
    assert b[0].kernels[0].schedule_length >= a[0].kernels[0].schedule_length + 4
    assert b[1].compute_cycles > a[1].compute_cycles


def test_wider_rows_fewer_row_accesses():
    a = run(variant(**{"pe_array.simd_lanes": 4, "spm.words_per_row": 4}), _gemm(), copies=4)[1]
    b = run(variant(**{"pe_array.simd_lanes": 4, "spm.words_per_row": 16}), _gemm(), copies=4)[1]
    assert b.spm_reads < a.spm_reads


def test_smaller_spm_more_tiles_then_capacity_error():
    big = map_program(_gemm(64, 8, 16), variant(**{"spm.capacity_words_per_line": 4096}),
                      max_tile_rows=64)
    small = map_program(_gemm(64, 8, 16), variant(**{"spm.capacity_words_per_line": 64}),
                        max_tile_rows=64)
    assert len(small.kernels[0].tiles) > len(big.kernels[0].tiles)
    with pytest.raises(MappingError, match=r"spm.lines x spm.capacity_words_per_line = 2 x 8"):
        map_program(_gemm(64, 8, 16), variant(**{"spm.lines": 2, "spm.capacity_words_per_line": 8}))


# --- DRAM and DMA ------------------------------------------------------------------------------

def test_more_dram_bandwidth_fewer_dram_stalls():
    slow = run(variant(**{"dram.bytes_per_cycle": 2.0}), _gemm())[1]
    fast = run(variant(**{"dram.bytes_per_cycle": 64.0}), _gemm())[1]
    assert fast.stall_cycles_dram < slow.stall_cycles_dram
    assert slow.cycles >= slow.dram_bytes / 2.0  # the bandwidth bound


def test_longer_dram_latency_more_cycles():
    kw = {"dram.dma_engines": 1}
    a = run(variant(**kw, **{"dram.latency_cycles": 10}), _gemm())[1]
    b = run(variant(**kw, **{"dram.latency_cycles": 400}), _gemm())[1]
    assert b.stall_cycles_dram > a.stall_cycles_dram and b.cycles > a.cycles


def test_more_dma_engines_hide_latency():
    """One engine exposes every transfer's latency; two overlap one transfer's latency with
    another's data (spmm loads A_val and A_crd per tile)."""
    kw = {"dram.latency_cycles": 300, "dram.channels": 1}
    one = run(variant(**kw, **{"dram.dma_engines": 1}), _spmm())[1]
    two = run(variant(**kw, **{"dram.dma_engines": 2}), _spmm())[1]
    assert two.stall_cycles_dram < one.stall_cycles_dram


def test_more_channels_at_equal_per_channel_bandwidth_fewer_stalls():
    """Channels serve different buffers in parallel (A_val and A_crd of each tile)."""
    per_channel = 1.0
    res = [run(variant(**{"dram.channels": c, "dram.dma_engines": 2,
                          "dram.bytes_per_cycle": per_channel * c}), _spmm())[1] for c in (1, 2)]
    assert res[1].stall_cycles_dram < res[0].stall_cycles_dram


def test_channels_at_equal_aggregate_bandwidth_keep_the_roofline():
    for c in (1, 2, 4):
        r = run(variant(**{"dram.channels": c, "dram.bytes_per_cycle": 4.0}), _spmm())[1]
        assert r.cycles >= r.dram_bytes / 4.0


# --- interconnect ------------------------------------------------------------------------------

def test_longer_hop_latency_longer_schedule():
    a = run(variant(), _gemm(), copies=8)
    b = run(variant(**{"interconnect.hop_latency_cycles": 4}), _gemm(), copies=8)
    assert b[0].kernels[0].schedule_length > a[0].kernels[0].schedule_length
    assert b[1].compute_cycles > a[1].compute_cycles


def test_link_capacity_lowers_ii():
    """Two copies of an 8-node random body on a 4x4 array fill every PE at II = 1; with one
    value per link per cycle the routes do not fit, with four they do."""
    k = random_program(10).kernels[0]
    small = {"pe_array.rows": 4, "pe_array.cols": 4}
    one = map_kernel(k, variant(**small, **{"interconnect.links_per_direction": 1}), copies=2)
    four = map_kernel(k, variant(**small, **{"interconnect.links_per_direction": 4}), copies=2)
    assert four.ii < one.ii
    assert four.ii == four.mii


def test_narrow_links_serialise_vectors():
    """An 8-lane vector over a 1-word link takes 8 flits per hop: routes take longer and the
    links fill up."""
    wide = map_kernel(gemm_kernel(8, 8, 16), variant(), copies=4)
    narrow = map_kernel(gemm_kernel(8, 8, 16), variant(**{"interconnect.link_width_words": 1}),
                        copies=4)
    assert (narrow.ii, narrow.schedule_length) > (wide.ii, wide.schedule_length)


def test_torus_and_skip_hops_shorten_distances():
    mesh = variant()
    torus = variant(**{"interconnect.topology": "torus"})
    skip = variant(**{"interconnect.skip_hop_strides": [2, 4]})

    def diameter(a):
        return max(max(d.values()) for d in hop_distance(a).values())

    assert diameter(torus) < diameter(mesh)
    assert diameter(skip) < diameter(mesh)
    assert hop_distance(mesh)[(0, 0)][(0, 7)] == 7
    assert hop_distance(torus)[(0, 0)][(0, 7)] == 1  # the wrap-around link
    assert hop_distance(skip)[(0, 0)][(0, 7)] == 3  # 4 + 2 + 1
    # routes on the torus only use links the torus has, wrap-around ones included
    km = map_kernel(gemm_kernel(8, 8, 16), torus, copies=16)

    def ring(x, y):  # distance on an 8-ring
        return min(abs(x - y), 8 - abs(x - y))

    for r in km.routes:
        for a, b in r.links:
            assert ring(a[0], b[0]) + ring(a[1], b[1]) == 1, (a, b)


# --- PE array ----------------------------------------------------------------------------------

def test_more_pes_more_copies_fewer_cycles():
    small = run(variant(**{"pe_array.rows": 2, "pe_array.cols": 2}), _gemm())[1]
    big = run(variant(), _gemm())[1]
    assert big.compute_cycles < small.compute_cycles


def test_wider_issue_lower_ii_fewer_cycles():
    """pe_array.issue_width 2 (docs/architecture.md#issue-width): a CSR SpMM body with loads, a
    gather and a macc (4 ops, 3 on the lsu) at 4 copies on 4 PEs: the issue slots bind at width
    1 (II 4), the lsu at width 2 (II 3); same copies, same values, fewer cycles."""
    from dataflow.dfg.transform import fuse_multiply_accumulate

    prog = _spmm()
    fused = dataclasses.replace(prog, kernels=tuple(fuse_multiply_accumulate(k)
                                                    for k in prog.kernels))
    ops = {n.op for n in fused.kernels[0].nodes}
    assert Op.MACC in ops and Op.LOAD in ops
    small = {"pe_array.rows": 2, "pe_array.cols": 2}
    one = run(variant(**small), fused, copies=4)
    two = run(variant(**small, **{"pe_array.issue_width": 2}), fused, copies=4)
    assert two[0].kernels[0].ii <= one[0].kernels[0].ii
    assert two[0].kernels[0].ii < one[0].kernels[0].ii  # strictly, on this case
    assert two[1].compute_cycles < one[1].compute_cycles
    assert np.array_equal(np.asarray(one[1].output), np.asarray(two[1].output))


def test_more_simd_lanes_fewer_cycles():
    a = run(variant(**{"pe_array.simd_lanes": 2}), _gemm(), copies=4)[1]
    b = run(variant(**{"pe_array.simd_lanes": 8}), _gemm(), copies=4)[1]
    assert b.compute_cycles < a.compute_cycles


def test_fu_latency_lengthens_schedule():
    fus = variant().pe_array.functional_units
    slow = tuple(dataclasses.replace(f, latency_cycles=8) if f.name == "mul" else f for f in fus)
    arch = variant()
    arch = dataclasses.replace(arch, pe_array=dataclasses.replace(arch.pe_array,
                                                                  functional_units=slow))
    a = run(variant(), _gemm(), copies=4)
    b = run(arch, _gemm(), copies=4)
    assert b[0].kernels[0].schedule_length == a[0].kernels[0].schedule_length + 6
    assert b[1].compute_cycles > a[1].compute_cycles


def test_fu_issue_interval_raises_ii():
    arch = variant()
    fus = tuple(dataclasses.replace(f, issue_interval_cycles=3) if f.name == "mul" else f
                for f in arch.pe_array.functional_units)
    arch = dataclasses.replace(arch, pe_array=dataclasses.replace(arch.pe_array,
                                                                  functional_units=fus))
    km = map_kernel(gemm_kernel(8, 8, 16), arch, copies=4)
    assert km.ii >= 3 and km.res_mii >= 3


def test_instruction_entries_limit_copies_and_name_the_resource():
    few = map_kernel(gemm_kernel(8, 8, 16), variant(**{"pe_array.rows": 2, "pe_array.cols": 2,
                                                       "pe_array.instruction_entries": 1}))
    many = map_kernel(gemm_kernel(8, 8, 16), variant(**{"pe_array.rows": 2, "pe_array.cols": 2}))
    assert few.copies == 1 and many.copies / many.ii >= few.copies / few.ii
    with pytest.raises(MappingError, match=r"instruction_entries = 3 x 1 = 3"):
        map_kernel(gemm_kernel(8, 8, 16), variant(**{"pe_array.rows": 1, "pe_array.cols": 3,
                                                     "pe_array.instruction_entries": 1}))


def test_register_file_too_small_names_registers():
    with pytest.raises(MappingError, match="register_file_entries = 1"):
        map_kernel(random_program(0).kernels[0],
                   variant(**{"pe_array.register_file_entries": 1, "pe_array.rows": 2,
                              "pe_array.cols": 2}), max_ii_slack=1)


def test_missing_functional_unit_names_it():
    arch = variant()
    fus = tuple(f for f in arch.pe_array.functional_units if f.name != "sfu")
    arch = dataclasses.replace(arch, pe_array=dataclasses.replace(arch.pe_array,
                                                                  functional_units=fus))
    prog = next(p for p in map(random_program, range(40))
                if any(n.op is Op.EXP for n in p.kernels[0].nodes))
    with pytest.raises(MappingError, match=r"no functional unit for op 'exp'"):
        map_kernel(prog.kernels[0], arch)


# --- system, energy, area ----------------------------------------------------------------------

def test_reconfiguration_cost_adds_cycles():
    prog = next(p for p in map(random_program, range(40)) if len(p.kernels) == 2)
    mapping = map_program(prog, variant(reconfiguration_cycles=0))
    a = simulate_mapping(mapping)
    b = simulate_mapping(dataclasses.replace(mapping, arch=variant(reconfiguration_cycles=500)))
    assert b.stall_cycles_reconfiguration == 2 * 500
    assert b.cycles >= a.cycles + 2 * 500 - a.stall_cycles_dram


def test_clock_changes_time_not_cycles():
    a = run(variant(), _gemm())[1]
    b = run(variant(clock_ghz=2.0), _gemm())[1]
    assert a.cycles == b.cycles and b.time_seconds == pytest.approx(a.time_seconds / 2)


def test_word_size_scales_dram_bytes():
    a = run(variant(), _gemm())[1]
    b = run(variant(dtype="float16", word_bytes=2), _gemm())[1]
    assert b.dram_bytes * 2 == a.dram_bytes


@pytest.mark.parametrize("key, component", [
    ("energy.mac_pj", "compute"), ("energy.spm_access_pj", "spm"),
    ("energy.dram_byte_pj", "dram"), ("energy.link_hop_pj", "interconnect"),
    ("energy.reconfiguration_pj", "reconfiguration"),
    ("area.pe_mm2", "pe_array"), ("area.spm_line_mm2", "spm"),
    ("area.router_mm2", "interconnect"),
])
def test_energy_and_area_tables_scale_their_component(key, component):
    base = variant()
    table, field = key.split(".")
    doubled = variant(**{key: 2 * getattr(getattr(base, table), field)})
    a, b = run(base, _gemm())[1], run(doubled, _gemm())[1]
    got = dict(b.energy_pj if table == "energy" else b.area_mm2)
    ref = dict(a.energy_pj if table == "energy" else a.area_mm2)
    assert ref[component] > 0
    assert got[component] == pytest.approx(2 * ref[component])
    assert {k: v for k, v in got.items() if k != component} == \
        pytest.approx({k: v for k, v in ref.items() if k != component})


def test_area_grows_with_lines_ports_and_links():
    base = dict(run(variant(), _gemm())[1].area_mm2)
    for key, comp in (("spm.lines", "spm"), ("spm.read_ports_per_line", "spm"),
                      ("interconnect.links_per_direction", "interconnect")):
        more = dict(run(variant(**{key: 4 if key != "spm.lines" else 32}), _gemm())[1].area_mm2)
        assert more[comp] > base[comp], key
    skip = dict(run(variant(**{"interconnect.skip_hop_strides": [2]}), _gemm())[1].area_mm2)
    assert skip["interconnect"] > base["interconnect"]


def test_double_buffering_hides_loads_behind_compute():
    """Tile i + 1 loads while tile i computes: the array waits for DRAM far less than the
    transfers take in all (only the first tile's load and what compute cannot cover)."""
    arch = variant(**{"dram.bytes_per_cycle": 32.0, "dram.latency_cycles": 0})
    _, r = run(arch, _gemm(64, 64, 16))
    transfer_cycles = r.dram_bytes / 32.0
    assert len(r.tile_spans) >= 4 and r.compute_cycles > transfer_cycles  # compute-bound
    assert r.stall_cycles_dram < 0.5 * transfer_cycles
    # tiles run back to back once the first is loaded: gaps only where loads outlast compute
    gaps = [b[2] - a[3] for a, b in zip(r.tile_spans, r.tile_spans[1:])]
    assert sum(gaps) <= r.stall_cycles_dram
