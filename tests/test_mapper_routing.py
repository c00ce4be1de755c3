"""The mapper's routing, negotiation, repair and annealing, and the verifier's new rules (FU
occupancy, flits, multicast, immediates), on small hand-built cases."""

import dataclasses

import numpy as np
import pytest

from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node
from dataflow.dfg.lower import gemm_kernel, lower_gemm
from dataflow.dfg.ops import Op
from dataflow.mapper import MappingError, map_kernel, map_program
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.schedule import schedule_kernel
from dataflow.mapper.tiling import _pack, classify_buffers
from dataflow.pe_array.simulate import simulate_mapping
from tests.archs import variant


def fly4() -> Kernel:
    """Two butterfly layers over 4 loads: every value feeds two consumers."""
    nodes = [Node(i, Op.LOAD, buffer="X", addr=Addr((("i", 4),), const=i)) for i in range(4)]
    for a, b in ((0, 1), (0, 1), (2, 3), (2, 3), (4, 6), (4, 6), (5, 7), (5, 7)):
        nodes.append(Node(len(nodes), Op.ADD if len(nodes) % 2 else Op.SUB, (a, b)))
    for j, v in enumerate(range(8, 12)):
        nodes.append(Node(len(nodes), Op.STORE, (v,), buffer="Y", addr=Addr((("i", 4),), const=j)))
    return Kernel("fly4", (Loop("i", 64),), tuple(nodes),
                  (Buffer("X", 256), Buffer("Y", 256, "output")))


ONE_LINK = {"interconnect.links_per_direction": 1}


def test_negotiation_and_repair_reach_ii_equal_mii_when_greedy_does_not():
    """With one value per link, the first placement of 2 copies overuses links at II = 1; the
    negotiated rip-up/reroute and the placement repair still find a legal II = 1 schedule."""
    arch = variant(**ONE_LINK)
    km = map_kernel(fly4(), arch, copies=2)
    check_kernel_mapping(km, arch)
    assert km.ii == km.mii == 1


def test_full_array_names_the_links_that_ran_out():
    arch = variant(**{**ONE_LINK, "pe_array.rows": 4, "pe_array.cols": 4})
    diag: list[str] = []
    assert schedule_kernel(fly4(), arch, 1, 1, diag) is None
    assert diag and diag[-1].startswith("links:")
    assert "interconnect.links_per_direction = 1" in diag[-1] and "II = 1" in diag[-1]


def test_no_slot_names_entries_and_units():
    """16 nodes, 4 PEs, II = 2: 8 issue slots. The failure says which slots ran out."""
    arch = variant(**{"pe_array.rows": 1, "pe_array.cols": 4})
    diag: list[str] = []
    assert schedule_kernel(fly4(), arch, 1, 2, diag) is None
    assert "found no free slot" in diag[-1]
    assert "pe_array.instruction_entries = 32" in diag[-1] and "slot of II = 2" in diag[-1]


def test_anneal_is_legal_and_never_worse():
    arch = variant()
    base = map_kernel(fly4(), arch, copies=3)
    imp = map_kernel(fly4(), arch, copies=3, improve="anneal", seed=1)
    check_kernel_mapping(imp, arch)
    assert imp.ii == base.ii

    def cost(k):
        return 16 * k.schedule_length + sum(len(r.links) for r in k.routes)

    assert cost(imp) <= cost(base)
    with pytest.raises(MappingError, match="unknown improvement pass"):
        map_kernel(fly4(), arch, improve="ilp")


def test_annealed_mapping_simulates_to_the_same_values():
    rng = np.random.default_rng(0)
    prog = lower_gemm(rng.standard_normal((8, 8), dtype=np.float32),
                      rng.standard_normal((8, 16), dtype=np.float32))
    a = simulate_mapping(map_program(prog, variant()))
    b = simulate_mapping(map_program(prog, variant(), improve="anneal"))
    assert np.array_equal(a.output, b.output)


def test_verifier_non_pipelined_unit_holds_its_slots():
    arch = variant()
    fus = tuple(dataclasses.replace(f, issue_interval_cycles=2) if f.name == "mul" else f
                for f in arch.pe_array.functional_units)
    arch = dataclasses.replace(arch, pe_array=dataclasses.replace(arch.pe_array,
                                                                  functional_units=fus))
    km = map_kernel(gemm_kernel(4, 4, 8), arch, copies=2)
    check_kernel_mapping(km, arch)
    km = dataclasses.replace(km, ii=4 * km.ii)  # more slots: room to move an op
    check_kernel_mapping(km, arch)
    used = {(p.pe, p.time % km.ii) for p in km.placements}
    muls = [p for p in km.placements if p.node == 2]
    m0 = next(m for m in muls if (m.pe, (m.time + 1) % km.ii) not in used)
    m1 = next(m for m in muls if m is not m0)
    # the second copy's mul on the first's PE one cycle later: issue slot free, unit still busy
    moved = dataclasses.replace(m1, pe=m0.pe, time=m0.time + 1)
    bad = dataclasses.replace(km, placements=tuple(moved if p is m1 else p for p in km.placements))
    with pytest.raises(MappingError, match="issue_interval_cycles = 2"):
        check_kernel_mapping(bad, arch)


def test_verifier_counts_flits_of_narrow_links():
    """A vector over a 1-word link arrives lanes - 1 cycles after its head flit."""
    wide, narrow = variant(), variant(**{"interconnect.link_width_words": 1})
    km = map_kernel(gemm_kernel(4, 4, 16), wide, copies=1)
    routed = [r for r in km.routes if r.links and r.src in (0, 1)]
    assert routed
    tight = [r for r in routed
             if r.depart + len(r.links) * 1 + 7 > km.placement_map[(r.copy, r.dst)].time]
    assert tight  # the wide schedule leaves no room for 8 flits
    with pytest.raises(MappingError, match="arrives after"):
        check_kernel_mapping(km, narrow)


def test_multicast_rides_a_link_once_and_constants_are_immediates():
    nodes = (Node(0, Op.LOAD, buffer="X", addr=Addr((("i", 1),))),
             Node(1, Op.CONST, value=3.0),
             Node(2, Op.MUL, (0, 1)), Node(3, Op.ADD, (0, 1)), Node(4, Op.ADD, (2, 3)),
             Node(5, Op.STORE, (4,), buffer="Y", addr=Addr((("i", 1),))))
    k = Kernel("fan", (Loop("i", 16),), nodes, (Buffer("X", 16), Buffer("Y", 16, "output")))
    arch = variant(**{**ONE_LINK, "pe_array.rows": 1, "pe_array.cols": 6})
    km = map_kernel(k, arch, copies=1)
    check_kernel_mapping(km, arch)
    assert all(not r.links for r in km.routes if r.src == 1)  # the constant: no link
    # the same value on one link in one slot counts once: two routes of %0 may share a link
    links0 = [set(r.links) for r in km.routes if r.src == 0]
    assert len(links0) == 2


def test_staggered_buffer_bases_avoid_conflicts_that_packing_creates():
    """The allocator staggers each buffer's first row over the lines; packed back to back, the
    streams of A, B and C meet on the same lines more often."""
    arch = variant(**{"spm.read_ports_per_line": 1, "spm.lines": 8})
    rng = np.random.default_rng(0)
    prog = lower_gemm(rng.standard_normal((16, 8), dtype=np.float32),
                      rng.standard_normal((8, 16), dtype=np.float32))
    mapping = map_program(prog, arch, copies=4)
    km = mapping.kernels[0]
    streamed = classify_buffers(km.kernel)
    peak = {a.buffer: (a.words - arch.spm.words_per_row) if a.streamed else a.words
            for a in km.allocations}
    packed, _ = _pack(km.kernel, list(km.kernel.buffers), streamed, peak, arch.spm.words_per_row)
    packed_km = dataclasses.replace(km, allocations=packed)
    staggered = simulate_mapping(mapping)
    naive = simulate_mapping(dataclasses.replace(mapping, kernels=(packed_km,)))
    assert np.array_equal(staggered.output, naive.output)
    assert staggered.stall_cycles_spm_conflict < naive.stall_cycles_spm_conflict


def test_map_kernel_error_carries_the_link_diagnosis():
    arch = variant(**{**ONE_LINK, "pe_array.rows": 4, "pe_array.cols": 4})
    with pytest.raises(MappingError,
                       match=r"with 1 copy at II = 1: links: .*links_per_direction = 1"):
        map_kernel(fly4(), arch, copies=1, max_ii_slack=0)
