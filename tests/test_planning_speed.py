"""Planning speed (issue 14 point 4) without changing a plan: the layout search's stall count
(`plan.layout_cost.kernel_stalls`, kernel by kernel in `spm_layout._LayoutCost`) equals the
engine's on random layouts, and stage schedules kept on disk (`plan.stage_mapping`) are reused
by a fresh process and ignored when stale, damaged or for another body."""

import dataclasses

import numpy as np
import pytest

from dataflow.arch.load import load_arch
from dataflow.cachefiles import frame_entry
from dataflow.dfg.lower_butterfly import ButterflyKind, ButterflySpec, group_kernel, split_stages
from dataflow.plan import spm_layout, stage_mapping
from dataflow.plan.layout_cost import kernel_stalls
from dataflow.plan.orchestrate import _tile_plan

ARCH = load_arch("arch_configs/mlx_4x4.yaml")


def _plan(n, real=True):
    spec = ButterflySpec(n=n, batch=16, lanes=ARCH.pe_array.simd_lanes, kind=ButterflyKind.FFT,
                         bitrev_input=True, real_input=real)
    tp = _tile_plan(spec, ARCH, "multilayer", 8)
    groups = split_stages(tp.spec.stages, tp.stages_per_kernel)
    return tp.spec, groups, tp.tile_rows, ARCH.pe_array.instruction_entries // len(groups)


def _random_layouts(spec, buffers, count, seed):
    rng = np.random.default_rng(seed)
    S = spec.stages
    for _ in range(count):
        yield (tuple(tuple(int(v) for v in rng.permutation(S)) for _ in range(buffers)),
               tuple(int(rng.integers(0, spec.n)) for _ in range(buffers)))


@pytest.mark.parametrize("n,real", [(64, False), (128, True)])
def test_layout_cost_equals_the_engine_on_random_layouts(n, real):
    spec, groups, rows, budget = _plan(n, real)
    assert len(groups) >= 2 and spec.skew_lines
    cost = spm_layout._LayoutCost(spec, ARCH, groups, rows, budget, "multilayer")
    ident = (tuple(tuple(range(spec.stages)) for _ in range(len(groups) + 1)),
             (0,) * (len(groups) + 1))
    seen = set()
    for layout in [ident, *_random_layouts(spec, len(groups) + 1, 4, n)]:
        sp = dataclasses.replace(spec, skew_perm=layout[0], skew_flip=layout[1])
        want = spm_layout.layout_stalls(sp, ARCH, groups, rows, budget)
        assert cost(layout) == want, layout
        seen.add(want)
    # the layouts differ in stalls, so an equality here is not a constant agreeing with itself
    assert len(seen) > 1
    # every kernel of the two-tile program is counted the same, one at a time
    prog, kms = spm_layout._two_tile_program(spec, ARCH, groups, rows, budget)
    from dataflow.mapper.mapping import Mapping
    from dataflow.pe_array.simulate import run_array
    arrays = run_array(Mapping(program=prog, arch=ARCH, kernels=tuple(kms),
                               orchestration="multilayer"))
    for km, a in zip(kms, arrays):
        assert kernel_stalls(km, ARCH) == sum(t.stall_cycles_spm_conflict for t in a.tiles)


def test_a_kernel_with_accumulation_is_left_to_the_engine():
    from dataflow.dfg.ops import Op
    from dataflow.plan.layout_cost import timing_only
    spec, groups, rows, budget = _plan(64)
    km = stage_mapping.map_stage_kernel(group_kernel(spec, groups[0], len(groups), 0), ARCH,
                                        rows, budget)
    assert timing_only(km)
    store = next(n for n in km.kernel.nodes if n.op is Op.STORE)
    nodes = tuple(dataclasses.replace(n, op=Op.ACC) if n is store else n
                  for n in km.kernel.nodes)
    odd = dataclasses.replace(km, kernel=dataclasses.replace(km.kernel, nodes=nodes))
    assert not timing_only(odd)
    assert kernel_stalls(odd, ARCH) is None


@pytest.fixture
def stage_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(stage_mapping, "_SHAPES", stage_mapping.BoundedCache(8))
    return tmp_path / "stages"


def _kernel():
    spec, groups, rows, budget = _plan(64)
    return group_kernel(spec, groups[0], len(groups), 0), rows, budget


def _no_mapping(monkeypatch):
    def fail(*a, **k):
        raise AssertionError("mapped again")
    monkeypatch.setattr(stage_mapping, "map_kernel", fail)


def _same(a, b):
    return (a.copies, a.ii, a.placements, a.routes, a.tiles, a.allocations) == \
        (b.copies, b.ii, b.placements, b.routes, b.tiles, b.allocations)


def test_stage_schedule_is_reused_from_disk(stage_dir, monkeypatch):
    kernel, rows, budget = _kernel()
    first = stage_mapping.map_stage_kernel(kernel, ARCH, rows, budget)
    files = list(stage_dir.glob("*.mapping"))
    assert len(files) == 1
    monkeypatch.setattr(stage_mapping, "_SHAPES", stage_mapping.BoundedCache(8))  # new process
    _no_mapping(monkeypatch)
    again = stage_mapping.map_stage_kernel(kernel, ARCH, rows, budget)
    assert again.kernel is kernel and _same(first, again) and again.notes == first.notes


@pytest.mark.parametrize("damage", ["flip", "truncate", "stale", "other body", "illegal"])
def test_a_bad_stage_file_is_deleted_and_remapped(stage_dir, monkeypatch, damage):
    kernel, rows, budget = _kernel()
    first = stage_mapping.map_stage_kernel(kernel, ARCH, rows, budget)
    (path,) = stage_dir.glob("*.mapping")
    clean = path.read_bytes()
    if damage == "flip":
        blob = bytearray(clean)
        blob[len(blob) // 2] ^= 0x40
        path.write_bytes(bytes(blob))
    elif damage == "truncate":
        path.write_bytes(clean[: len(clean) // 2])
    elif damage == "stale":
        header, payload = clean.split(b"\n", 1)
        path.write_bytes(header.replace(b'"fingerprint": "', b'"fingerprint": "0') + b"\n"
                         + payload)
    else:
        import pickle
        record = pickle.loads(clean.split(b"\n", 1)[1])
        if damage == "other body":
            record["body"] = "another body"
        else:  # a schedule that puts two nodes on one PE slot
            km = record["km"]
            p0, p1 = km.placements[0], km.placements[1]
            bad = (p0, dataclasses.replace(p1, pe=p0.pe, time=p0.time), *km.placements[2:])
            record["km"] = dataclasses.replace(km, placements=bad)
        path.write_bytes(frame_entry(stage_mapping.STAGE_KIND, stage_mapping.STAGE_VERSION,
                                     pickle.dumps(record)))
    monkeypatch.setattr(stage_mapping, "_SHAPES", stage_mapping.BoundedCache(8))
    assert stage_mapping._stage_disk_get(
        (stage_mapping.shape_key(kernel, ARCH), budget), kernel, ARCH, rows) is None
    assert not path.exists()
    again = stage_mapping.map_stage_kernel(kernel, ARCH, rows, budget)  # mapped and rewritten
    assert _same(first, again)
    assert path.exists()


@pytest.mark.parametrize("depth,ports", [(0, 1), (1, 1), (2, 1), (4, 2)])
def test_port_stalls_step_like_store_queues(depth, ports):
    """`layout_cost._stalls` (queues stepped in integers, idle cycles skipped; port_cycles
    without queues) against `StoreQueues` stepped over every cycle, on random row accesses."""
    from dataflow.arch.spec import AddressMapping
    from dataflow.plan.layout_cost import _stalls
    from dataflow.spm.lines import StoreQueues
    spm = dataclasses.replace(ARCH.spm, write_queue_depth=depth, read_ports_per_line=ports,
                              write_ports_per_line=ports)
    assert spm.address_mapping == AddressMapping.INTERLEAVED  # row r on line r % lines
    rng = np.random.default_rng(depth * 10 + ports)
    totals = set()
    for trial in range(30):
        cycles = int(rng.integers(1, 60))
        busy = rng.random() * 0.6
        shape = (cycles, spm.lines)
        rd = rng.integers(0, 3 * ports, shape) * (rng.random(shape) < busy)
        wr = rng.integers(0, 4 * ports, shape) * (rng.random(shape) < busy)

        def accesses(counts):
            # counts[t, line] distinct rows of that line in cycle t
            cyc, row = [], []
            for t, ln in zip(*np.nonzero(counts)):
                for j in range(counts[t, ln]):
                    cyc.append(t)
                    row.append(ln + spm.lines * j)
            return [(np.array(cyc, np.int64), np.array(row, np.int64))] if cyc else []

        sq = StoreQueues(spm)
        want = sum(sq.cycle(rd[t], wr[t])[0] for t in range(cycles)) + sq.drain()[0]
        assert _stalls(accesses(rd), accesses(wr), spm, cycles) == want, trial
        totals.add(want)
    assert len(totals) > 3


def test_rec_mii_shortcut_is_the_cycle_enumeration():
    """`rec_mii` returns 1 without enumerating cycles when no edge is loop-carried; on kernels
    with and without carried edges it equals the enumeration."""
    import math

    import networkx as nx

    from dataflow.mapper.bounds import op_latency, rec_mii
    from tests.archs import variant
    from tests.programs import random_program

    arch = variant()

    def enumerated(kernel):
        g, best = kernel.graph(), 1
        for cycle in nx.simple_cycles(g):
            lat = dist = 0
            for a, b in zip(cycle, cycle[1:] + cycle[:1]):
                op = kernel.nodes[a].op
                lat += 1 if op.accumulates and len(cycle) == 1 else op_latency(arch, op)
                dist += g.edges[a, b]["distance"]
            if dist:
                best = max(best, math.ceil(lat / dist))
        return best

    kernels = [k for s in range(12) for k in random_program(s).kernels]
    spec, groups, _, _ = _plan(64)
    kernels += [group_kernel(spec, g, len(groups), i) for i, g in enumerate(groups)]
    got = [(rec_mii(k, arch), enumerated(k), bool(k.carried)) for k in kernels]
    assert all(a == b for a, b, _ in got), got
    # both paths are exercised: bodies with loop-carried edges and plain ones
    assert any(c for _, _, c in got)
    assert any(not c for _, _, c in got)


# --- schedules of identical bodies (mapper/map.py `_schedule`) ---------------------------------

def _fly4(const: int = 0, vector: bool = False):
    """tests/test_mapper_routing.py's fly4 with its addresses moved by `const` words; `vector`
    makes the loads vectors (more link flits: another body for the scheduler)."""
    from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node
    from dataflow.dfg.ops import Op
    step = (("i", 4),) if not vector else (("i", 4), ("v", 1))
    nodes = [Node(i, Op.LOAD, buffer="X", addr=Addr(step, const=i + const)) for i in range(4)]
    for a, b in ((0, 1), (0, 1), (2, 3), (2, 3), (4, 6), (4, 6), (5, 7), (5, 7)):
        nodes.append(Node(len(nodes), Op.ADD if len(nodes) % 2 else Op.SUB, (a, b)))
    for j, v in enumerate(range(8, 12)):
        nodes.append(Node(len(nodes), Op.STORE, (v,), buffer="Y",
                          addr=Addr((("i", 4),), const=j + const)))
    loops = (Loop("i", 16),) + ((Loop("v", 4),) if vector else ())
    return Kernel(f"fly4+{const}", loops, tuple(nodes),
                  (Buffer("X", 256), Buffer("Y", 256, "output")),
                  vector_var="v" if vector else None)


def test_identical_bodies_are_scheduled_once(monkeypatch):
    """A body with other addresses reuses the memoised attempts (no schedule_kernel call) and
    gets exactly the mapping an unmemoised call gives; another body (vector loads: more
    flits) is scheduled anew."""
    import dataflow.mapper.map as map_module
    from dataflow.mapper.legality import check_kernel_mapping
    from tests.archs import variant
    arch = variant(**{"interconnect.links_per_direction": 1})
    calls = []
    real = map_module.schedule_kernel

    def counted(kernel, *a, **k):
        calls.append(kernel.name)
        return real(kernel, *a, **k)

    monkeypatch.setattr(map_module, "schedule_kernel", counted)
    monkeypatch.setattr(map_module, "SCHEDULES", map_module.BoundedCache(64))
    first = map_module.map_kernel(_fly4(0), arch, copies=2)
    n = len(calls)
    assert n >= 1
    moved = _fly4(64)
    assert map_module.body_key(moved) == map_module.body_key(_fly4(0))
    again = map_module.map_kernel(moved, arch, copies=2)
    assert len(calls) == n  # nothing scheduled
    check_kernel_mapping(again, arch)
    assert again.kernel is moved
    map_module.SCHEDULES.clear()
    fresh = map_module.map_kernel(moved, arch, copies=2)
    assert len(calls) == 2 * n
    assert (again.copies, again.ii, again.placements, again.routes) == \
        (fresh.copies, fresh.ii, fresh.placements, fresh.routes) == \
        (first.copies, first.ii, first.placements, first.routes)
    vec = _fly4(0, vector=True)
    assert map_module.body_key(vec) != map_module.body_key(_fly4(0))
    map_module.map_kernel(vec, arch, copies=2)
    assert len(calls) > 2 * n


def test_a_failed_attempt_is_remembered_with_its_reason(monkeypatch):
    import dataflow.mapper.map as map_module
    from tests.archs import variant
    arch = variant(**{"interconnect.links_per_direction": 1, "pe_array.rows": 4,
                      "pe_array.cols": 4})
    monkeypatch.setattr(map_module, "SCHEDULES", map_module.BoundedCache(64))
    first: list[str] = []
    assert map_module._schedule(_fly4(0), arch, 1, 1, first) is None
    monkeypatch.setattr(map_module, "schedule_kernel", None)  # a second call would fail
    again: list[str] = []
    assert map_module._schedule(_fly4(8), arch, 1, 1, again) is None
    assert again == first and first[0].startswith("links:")


def test_route_state_keeps_overuse_as_a_scan_counts_it():
    """`RouteState.over_total` and `overused()` (kept by reserve / unreserve) against a scan of
    every (link, slot), over random reservations and releases at capacity 1 and 2."""
    from collections import Counter

    from dataflow.mapper.routing import RouteState
    from tests.archs import variant
    for cap in (1, 2):
        arch = variant(**{"interconnect.links_per_direction": cap})
        st = RouteState(_fly4(0), arch, 3)
        rng = np.random.default_rng(cap)
        held: Counter = Counter()
        peak = 0
        for _ in range(2000):
            keys = [int(k) for k in rng.choice(12, size=int(rng.integers(1, 4)), replace=False)]
            value = (0, int(rng.integers(0, 5)))
            mine = [(k, value) for k in keys]
            if rng.random() < 0.55 or not all(held[m] for m in mine):
                st.reserve(keys, value)
                held.update(mine)
            else:
                st.unreserve(keys, value)
                held.subtract(mine)
            scan = {k: len(c) - cap for k, c in st.carry.items() if len(c) > cap}
            assert st.overused() == scan and list(st.overused()) == list(scan)
            assert st.over_total == sum(scan.values())
            peak = max(peak, st.over_total)
        assert peak >= 3  # overuse did happen and come and go


@pytest.mark.parametrize("n", [64, 256])
def test_layout_search_with_a_bound_picks_what_the_full_count_picks(n, monkeypatch, tmp_path):
    """`_LayoutCost` stops counting a candidate's kernels once they reach the best layout's
    stalls: the search keeps the same layout and note as with every kernel counted, and
    counts no more kernels."""
    from dataflow.cachefiles import BoundedCache
    monkeypatch.setenv("DATAFLOW_CACHE_DIR", str(tmp_path))
    spec, groups, rows, budget = _plan(n)
    counted = []
    real = spm_layout.kernel_stalls

    def count(*a, **k):
        counted.append(1)
        return real(*a, **k)

    monkeypatch.setattr(spm_layout, "kernel_stalls", count)
    runs = []
    plain = spm_layout._LayoutCost.__call__
    for full in (False, True):
        monkeypatch.setattr(spm_layout, "_LAYOUTS", BoundedCache(8))
        for f in tmp_path.glob("layouts/*"):
            f.unlink()
        if full:
            monkeypatch.setattr(spm_layout._LayoutCost, "__call__",
                                lambda self, layout, bound=None: plain(self, layout))
        counted.clear()
        runs.append((spm_layout.choose_layout(spec, ARCH, groups, rows, budget), len(counted)))
    (bounded, fewer), (full, every) = runs
    assert bounded == full and "conflict stall cycles" in full[1]
    assert fewer <= every
