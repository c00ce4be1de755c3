"""Prefetch of the next kernel's first-tile inputs (`dram.prefetch_next_kernel`,
docs/conventions.md#system-level): closed forms on hand-made tiles, the SPM capacity rule,
and a mapped two-kernel program with the flag on and off."""

import dataclasses
import math

import numpy as np
import pytest

from dataflow.arch import ArchError
from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.result import TileResult
from dataflow.pe_array.simulate import _prefetch, simulate_mapping
from dataflow.pe_array.system import prefetch_sets, run_system
from tests.archs import variant

LAT, BW, RECONF = 100, 8.0, 64
ONE = {"dram.channels": 1, "dram.dma_engines": 1, "dram.latency_cycles": LAT,
       "dram.bytes_per_cycle": BW, "reconfiguration_cycles": RECONF}


def _tile(kernel, compute, *transfers):
    rd = sum(n for _, k, n in transfers if k == "read")
    wr = sum(n for _, k, n in transfers if k == "write")
    return TileResult(kernel=kernel, index=0, iterations=1, compute_cycles=compute,
                      stall_cycles_spm_conflict=0, dram_bytes_read=rd, dram_bytes_written=wr,
                      dram_transfers=tuple(transfers))


def _two(ca=2000, cb=50, xa=800, wb=1600):
    """Kernel a reads x (xa bytes) for `ca` cycles; kernel b reads the weight w (wb bytes)."""
    return [("a", (_tile("a", ca, ("x", "read", xa)),)),
            ("b", (_tile("b", cb, ("w", "read", wb)),))]


def test_prefetch_hides_the_next_kernels_load_closed_form():
    arch = variant(**ONE)
    ca, cb, xa, wb = 2000, 50, 800, 1600
    load_a, load_b = LAT + math.ceil(xa / BW), LAT + math.ceil(wb / BW)
    off = run_system(_two(ca, cb, xa, wb), arch)
    assert off.cycles == RECONF + load_a + ca + RECONF + load_b + cb
    on = run_system(_two(ca, cb, xa, wb), arch, prefetch=[frozenset(), frozenset({"w"})])
    # w is issued when x has landed and lands long before a ends: b's load is hidden whole
    assert load_b < ca + RECONF
    assert on.cycles == RECONF + load_a + ca + RECONF + cb == off.cycles - load_b
    assert on.stall_cycles_dram == off.stall_cycles_dram - load_b
    assert on.kernel_spans[1] == (RECONF + load_a + ca, on.cycles)
    # never below the DRAM floor of the two loads
    assert on.cycles >= (xa + wb) / BW


def test_prefetch_partly_hidden_behind_a_short_kernel():
    arch = variant(**ONE)
    ca, cb, xa, wb = 10, 50, 800, 1600
    load_a, load_b = LAT + math.ceil(xa / BW), LAT + math.ceil(wb / BW)
    on = run_system(_two(ca, cb, xa, wb), arch, prefetch=[frozenset(), frozenset({"w"})])
    # b's first tile waits for w, issued when x landed: RECONF + load_a + load_b
    assert on.cycles == RECONF + load_a + load_b + cb
    off = run_system(_two(ca, cb, xa, wb), arch)
    assert on.cycles == off.cycles - (ca + RECONF)


def test_prefetch_waits_for_the_rest_of_the_first_tile():
    """b's first tile also reads y (not prefetched): it loads after b's reconfiguration."""
    arch = variant(**ONE)
    tiles = _two()
    tiles[1] = ("b", (_tile("b", 50, ("w", "read", 1600), ("y", "read", 80)),))
    on = run_system(tiles, arch, prefetch=[frozenset(), frozenset({"w"})])
    a_end = RECONF + LAT + 100 + 2000
    assert on.cycles == a_end + RECONF + LAT + 10 + 50


def test_empty_prefetch_is_the_old_model():
    arch = variant(**ONE)
    assert run_system(_two(), arch, prefetch=[frozenset(), frozenset()]) == run_system(
        _two(), arch)


def test_prefetch_sets_check_capacity_and_producers():
    k0 = (["x"], ["h"], {"x": 100}, 600)
    k1 = (["h", "w", "v"], ["y"], {"h": 50, "w": 300, "v": 200}, 900)
    # h is written by k0 (never prefetched); w fits beside k0's 600 words, then v does not
    assert prefetch_sets([k0, k1], 1000) == [frozenset(), frozenset({"w"})]
    assert prefetch_sets([k0, k1], 1100) == [frozenset(), frozenset({"w", "v"})]
    # w does not fit in 250 words, v (later in buffer order) does
    assert prefetch_sets([k0, k1], 850) == [frozenset(), frozenset({"v"})]
    # no room beside k0: no prefetch
    assert prefetch_sets([k0, k1], 750) == [frozenset(), frozenset()]
    # a buffer written by any earlier kernel is not a program input
    k2 = (["x", "h"], [], {"x": 1, "h": 1}, 1)
    assert prefetch_sets([k0, k1, k2], 10**6)[2] == frozenset({"x"})


def _scale(name, src, dst, m=16, n=64):
    nodes = (Node(0, Op.LOAD, buffer=src, addr=Addr((("i", n), ("j", 1)))),
             Node(1, Op.CONST, value=2.0),
             Node(2, Op.MUL, (0, 1)),
             Node(3, Op.STORE, (2,), buffer=dst, addr=Addr((("i", n), ("j", 1)))))
    return Kernel(name, (Loop("i", m), Loop("j", n)), nodes,
                  (Buffer(src, m * n), Buffer(dst, m * n, "output")), vector_var="j")


def _program(m=16, n=64):
    """C = 2A then E = 2C and D = 2B: kernel 3 reads the program input B, kernel 2 reads C."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal(m * n).astype(np.float32) for _ in range(2))
    prog = Program("chain", (_scale("k1", "A", "C"), _scale("k2", "C", "E"),
                             _scale("k3", "B", "D")),
                   (("A", a), ("B", b)), (("D", (m, n)), ("C", (m, n)), ("E", (m, n))))
    return run_passes(prog), a, b


def test_mapped_program_flag_on_and_off():
    prog, a, b = _program()
    on_arch, off_arch = variant(), variant(**{"dram.prefetch_next_kernel": False})
    on_map, off_map = map_program(prog, on_arch), map_program(prog, off_arch)
    early = _prefetch(on_map)
    assert early == [frozenset(), frozenset(), frozenset({"B"})]  # C is k1's output
    assert _prefetch(off_map) is None
    on, off = simulate_mapping(on_map), simulate_mapping(off_map)
    np.testing.assert_allclose(on.output, 2 * b.reshape(on.output.shape), rtol=1e-6)
    np.testing.assert_array_equal(on.output, off.output)
    # off: the old model exactly (no prefetch argument)
    old = run_system([(k.kernel, k.tiles) for k in off.kernels], off_arch)
    assert off.cycles == old.cycles and off.stall_cycles_dram == old.stall_cycles_dram
    assert on.cycles < off.cycles
    assert on.cycles >= on.roofline_cycles and off.cycles >= off.roofline_cycles
    assert on.dram_bytes == off.dram_bytes


def test_no_prefetch_when_the_spm_cannot_hold_both():
    """B's slot beside k2's buffers: one word short of the capacity, no prefetch (and the
    run is the flag-off run); exactly enough, B is prefetched."""
    prog, _, _ = _program()
    mapping = map_program(prog, variant())
    occupied = max(max(x.base, x.base_alt or 0) + x.words for x in mapping.kernels[1].allocations)
    need = occupied + mapping.kernels[2].allocation_map["B"].words

    def with_capacity(words):
        arch = mapping.arch
        spm = dataclasses.replace(arch.spm, lines=1, capacity_words_per_line=words)
        return dataclasses.replace(mapping, arch=dataclasses.replace(arch, spm=spm))

    assert _prefetch(with_capacity(need))[2] == frozenset({"B"})
    tight = with_capacity(need - 1)
    assert _prefetch(tight) == [frozenset()] * 3
    off = dataclasses.replace(tight.arch, dram=dataclasses.replace(
        tight.arch.dram, prefetch_next_kernel=False))
    assert simulate_mapping(tight).cycles == simulate_mapping(
        dataclasses.replace(tight, arch=off)).cycles


def test_flag_must_be_a_bool():
    with pytest.raises(ArchError):
        variant(**{"dram.prefetch_next_kernel": "yes"})


def test_system_memo_equals_simulating_every_time(monkeypatch):
    """`run_system`'s timeline memo: inputs that differ in any one thing the timeline reads
    (a tile's compute cycles, a transfer's bytes, the DRAM latency, the reconfiguration, the
    prefetch sets) each get the timeline simulated afresh (a key blind to one would hand back
    another's: all differ here); the same inputs again are answered from the memo."""
    from dataflow.pe_array import system

    arch = variant(**ONE)
    cases = [(_two(), arch, None), (_two(ca=1999), arch, None), (_two(wb=1608), arch, None),
             (_two(), variant(**ONE | {"dram.latency_cycles": LAT + 1}), None),
             (_two(), variant(**ONE | {"reconfiguration_cycles": RECONF + 3}), None),
             (_two(), arch, [frozenset(), frozenset({"w"})])]
    monkeypatch.setenv(system.MEMO_ENV, "0")
    fresh = [run_system(*c) for c in cases]
    assert len({f.cycles for f in fresh}) == len(cases)
    monkeypatch.setenv(system.MEMO_ENV, "1")
    system._TIMELINES.clear()
    hits = system.MEMO_STATS["hits"]
    first = [run_system(*c) for c in cases]
    assert system.MEMO_STATS["hits"] == hits
    again = [run_system(*c) for c in cases]
    assert system.MEMO_STATS["hits"] - hits == len(cases)
    assert first == fresh == again
