"""The mapper on large arrays (issue 14, point 7): closed-form hop counts against a BFS over the
links, routes and placement that stay local, the best-first copy search against the exhaustive
one, and a GEMM on the largest reconfigurable array the limits allow. Timings are measured in
benchmarks/bench_mapper_scale.py, not here."""

import copy
from collections import Counter

import numpy as np
import pytest
import yaml

import dataflow
import dataflow.mapper.map as map_module
from dataflow.arch.limits import MAX_RECONFIGURABLE_SIDE
from dataflow.dfg.lower import gemm_kernel
from dataflow.mapper import routing
from dataflow.mapper.bounds import rec_mii, res_mii
from dataflow.mapper.legality import check_kernel_mapping
from dataflow.mapper.mapping import Placement
from dataflow.mapper.routing import RouteState, hop, hop_distance, line_hops, shortest_path
from dataflow.mapper.schedule import (
    PLACEMENT_REACH_PES,
    _Attempt,
    _Candidates,
    _NearPEs,
    schedule_kernel,
)
from dataflow.mapper.tiling import tile_and_allocate
from tests.archs import default_dict, variant
from tests.programs import random_program
from tests.test_mapper_routing import fly4

SHAPES = [(1, 1), (1, 6), (2, 2), (3, 5), (4, 4), (5, 7), (7, 3)]
STRIDES = [[], [2], [3], [4], [2, 3], [4, 2], [5, 3, 2]]


def _arch(rows, cols, topology="mesh", strides=()):
    return variant(**{"pe_array.rows": rows, "pe_array.cols": cols,
                      "interconnect.topology": topology,
                      "interconnect.skip_hop_strides": list(strides)})


def _archs():
    for rows, cols in SHAPES:
        for topology in ("mesh", "torus"):
            for strides in STRIDES:
                if all(2 <= s < max(rows, cols) for s in strides):
                    yield _arch(rows, cols, topology, strides)


def _bfs(arch, src) -> dict:
    """Hops from src to every PE: breadth-first over `_neighbours`, the links themselves."""
    dist, frontier = {src: 0}, [src]
    while frontier:
        nxt = []
        for pe in frontier:
            for nb in routing._neighbours(arch, pe):
                if nb not in dist:
                    dist[nb] = dist[pe] + 1
                    nxt.append(nb)
        frontier = nxt
    return dist


def _pes(arch):
    return [(r, c) for r in range(arch.pe_array.rows) for c in range(arch.pe_array.cols)]


def test_hop_is_the_bfs_distance_on_every_topology_for_every_pair():
    archs = list(_archs())
    assert len(archs) > 60
    for arch in archs:
        table = hop_distance(arch)
        for a in _pes(arch):
            truth = _bfs(arch, a)
            assert len(truth) == arch.pe_array.num_pes  # every PE reachable
            for b, d in truth.items():
                assert hop(arch, a, b) == d == table[a][b], (arch.source, a, b)


def test_line_hops_by_hand():
    # a 6-PE line with stride 4: 0 -> 4 -> 3 overshoots and steps back (2 hops, not 3)
    assert line_hops(6, (4,), False, 0)[3] == 2
    assert line_hops(6, (4,), False, 0)[5] == 2  # 0 -> 4 -> 5
    assert line_hops(6, (4,), True, 5)[3] == 1  # 5 + 4 wraps to 3 on a torus
    assert line_hops(6, (4,), False, 5)[3] == 2  # on a mesh 5 -> 4 -> 3
    assert line_hops(8, (), True, 0)[7] == 1
    assert line_hops(8, (), False, 0)[7] == 7
    # a PE pair: the row line's hops plus the column line's
    arch = _arch(6, 6, "mesh", [4])
    assert hop(arch, (0, 0), (3, 5)) == 2 + 2


def test_shortest_paths_follow_links_and_have_hop_length():
    for arch in (_arch(5, 7), _arch(5, 7, "torus", [2]), _arch(4, 4, "mesh", [3, 2])):
        pes = _pes(arch)
        for a in pes:
            for b in pes:
                for cols_first in (False, True):
                    path = shortest_path(arch, a, b, cols_first)
                    assert path[0] == a and path[-1] == b
                    assert len(path) - 1 == hop(arch, a, b)
                    assert all(q in routing._neighbours(arch, p) for p, q in zip(path, path[1:]))


def _reference_order(st, near, routed):
    """The placement order the mapper used to build: every PE sorted by hops summed over the
    routed inputs, ties in anchor order."""
    return sorted(near, key=lambda q: sum(hop(st.arch, p.pe, q) for p in routed))


def _feasible(st, order, routed, t):
    return [q for q in order if all(st.hops(p.pe, q) * st.hop + st.flits[p.node] - 1
                                    <= t - p.time - p.latency for p in routed)]


@pytest.mark.parametrize("rows, cols, topology, strides",
                         [(8, 8, "mesh", []), (6, 9, "torus", [2]), (30, 30, "mesh", []),
                          (24, 24, "torus", [4, 2])])
def test_candidates_are_the_whole_array_order_without_the_pes_out_of_reach(
        rows, cols, topology, strides):
    """At cycle t the candidates are exactly the PEs of the whole-array order that every input
    can reach by t (on a large array: those within the capped ball)."""
    arch = _arch(rows, cols, topology, strides)
    st = RouteState(gemm_kernel(4, 4, 8), arch, 2)
    rng = np.random.default_rng(rows)
    for trial in range(4):
        pes = [tuple(int(x) for x in rng.integers(0, (rows, cols))) for _ in range(3)]
        routed = [Placement(node=n, copy=0, pe=pe, time=int(rng.integers(0, 4)), latency=1)
                  for n, pe in zip((0, 1, 2), pes[:2 + trial % 2])]
        near = _NearPEs(pes[2], rows, cols)
        assert list(near) == sorted(_pes(arch), key=near.rank)
        full = _reference_order(st, near, routed)
        cands = _Candidates(st, near, routed)
        capped = arch.pe_array.num_pes > PLACEMENT_REACH_PES
        for t in range(0, rows + cols + 8):
            got = _feasible(st, cands.at(t), routed, t)
            want = _feasible(st, full, routed, t)
            if capped:
                assert len(cands.at(t)) < 4 * PLACEMENT_REACH_PES
                taken = set(cands.at(t))
                want = [q for q in want if q in taken]
            assert got == want


def test_placement_on_a_large_array_touches_only_the_pes_near_the_kernel(monkeypatch):
    """No per-array table: all-pairs distances are never built, the link tables hold only the
    PEs the routes touched (as many on a 128 x 128 array as on a 64 x 64 one), and the body
    maps at the same copies and II as on a 32 x 32 array."""
    def no_all_pairs(arch):
        raise AssertionError("the mapper built an all-pairs distance table")

    monkeypatch.setattr(routing, "hop_distance", no_all_pairs)
    kernel = gemm_kernel(32, 32, 32)
    touched = {}
    for side in (64, 128):
        attempt = _Attempt(kernel, _arch(side, side), 32, 3, Counter(), 0)
        placements, _ = attempt.run()
        assert len(placements) == 32 * len(kernel.nodes)
        touched[side] = len(attempt.st.nbrs)
        assert touched[side] <= len(placements)
    assert touched[64] == touched[128]
    big = _arch(128, 128)
    km = map_module.map_kernel(kernel, big)
    small = map_module.map_kernel(kernel, _arch(32, 32))
    assert (km.copies, km.ii) == (small.copies, small.ii) and km.ii == km.mii
    check_kernel_mapping(km, big)


def _exhaustive(kernel, arch, slack=8):
    """(copies, II) the mapper chose before the best-first search: every copy count from the
    most down, each II from its MII up while it could still beat the best found."""
    tiles, allocs = tile_and_allocate(kernel, arch)
    rec = rec_mii(kernel, arch)
    best = None
    for u in range(max(1, arch.pe_array.num_pes // len(kernel.nodes)), 0, -1):
        res = res_mii(kernel, arch, u)
        mii = max(res, rec)
        for ii in range(mii, mii + slack + 1):
            if best is not None and map_module._score(u, ii) <= map_module._score(*best):
                break
            got = schedule_kernel(kernel, arch, u, ii)
            if got is None:
                continue
            km = map_module._kernel_mapping(kernel, u, ii, res, rec, got, allocs, tiles)
            check_kernel_mapping(km, arch)
            best = (u, ii)
            break
    return best


@pytest.mark.parametrize("case", ["gemm", "fly4", "random1", "random5"])
def test_best_first_copy_search_chooses_what_the_exhaustive_one_did(case):
    arch = variant(**{"pe_array.rows": 4, "pe_array.cols": 4})
    kernel = {"gemm": gemm_kernel(8, 8, 16), "fly4": fly4()}.get(case)
    if kernel is None:
        kernel = random_program(int(case[len("random"):])).kernels[0]
    km = map_module.map_kernel(kernel, arch)
    assert (km.copies, km.ii) == _exhaustive(kernel, arch)


def test_a_gemm_maps_and_simulates_on_the_largest_reconfigurable_array(tmp_path):
    d = copy.deepcopy(default_dict())
    d["pe_array"]["rows"] = d["pe_array"]["cols"] = MAX_RECONFIGURABLE_SIDE
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(d))
    res = dataflow.simulate("gemm", arch=path, m=32, k=32, n=32)
    assert res.values_match_reference
