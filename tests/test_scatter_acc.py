"""SCATTER_ACC (indirect accumulate, PIT's SWrite with accumulate): both engines bit for bit,
values exact in the documented order, same-word lanes serialised as port conflicts, verifier."""

from __future__ import annotations

import numpy as np
import pytest

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.lower import run_passes
from dataflow.dfg.ops import Op
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import run_array
from tests.archs import variant

LANES = 8


def scatter_acc_program(idx: np.ndarray, v: np.ndarray, slots: int, same_word: bool) -> Program:
    """C[idx[i] * 8 + lane] += v[i, lane] (distinct words of one SPM row), or with `same_word`
    C[idx[i] * 8] += v[i, lane] for every lane (all eight lanes on one word)."""
    n = len(idx)
    nodes = (
        Node(0, Op.LOAD, buffer="idx", addr=Addr((("i", 1),)), name="idx"),
        Node(1, Op.LOAD, buffer="v", addr=Addr((("i", LANES), ("j", 1))), name="v"),
        Node(2, Op.SCATTER_ACC, (0, 1), buffer="C",
             addr=Addr(() if same_word else (("j", 1),), index_stride=LANES), name="C[idx]+="),
    )
    kern = Kernel(name="sacc", loops=(Loop("i", n), Loop("j", LANES)), nodes=nodes,
                  buffers=(Buffer("idx", n), Buffer("v", n * LANES),
                           Buffer("C", slots * LANES, "output")),
                  vector_var="j", carried=((2, 2, 1),))
    return run_passes(Program(name="sacc", kernels=(kern,),
                              inputs=(("idx", idx.astype(np.int64)),
                                      ("v", v.astype(np.float32).ravel())),
                              outputs=(("C", (slots * LANES,)),), dtype="float32"))


def replay(km, idx: np.ndarray, v: np.ndarray, slots: int,
           same_word: bool) -> tuple[np.ndarray, int]:
    """The documented semantics on the host: tiles (ranges of i) one after another; in a tile
    of n iterations, its k-th on copy k // W, wave k % W (W = ceil(n / copies)); a copy's run
    of same-index iterations adds in its register (iteration order) and flushes at the run's
    last iteration, issued at wave * II + t(copy); flushes commit in (tile, cycle, iteration)
    order, lanes in lane order, one float32 add each. Returns (C, flushes)."""
    U, II = km.copies, km.ii
    t = {p.copy: p.time for p in km.placements if p.node == 2}
    events = []
    for ti, tile in enumerate(km.tiles):
        ids = np.arange(tile.lo, tile.hi)  # one vector per i: iteration = i
        n = len(ids)
        waves = -(-n // U)
        k = 0
        while k < n:
            c = k // waves
            end = k
            while end + 1 < n and (end + 1) // waves == c and idx[ids[end + 1]] == idx[ids[k]]:
                end += 1
            reg = np.zeros(LANES, np.float32)
            for i in range(k, end + 1):
                reg = reg + v[ids[i]]
            events.append((ti, (end % waves) * II + t[c], end, idx[ids[k]], reg))
            k = end + 1
    out = np.zeros(slots * LANES, np.float32)
    for *_, row, reg in sorted(events, key=lambda e: e[:3]):
        for lane in range(LANES):
            w = row * LANES + (0 if same_word else lane)
            out[w] = np.float32(out[w] + reg[lane])
    return out, len(events)


@pytest.mark.parametrize("same_word", [False, True], ids=["row", "one-word"])
@pytest.mark.parametrize("arch_changes", [{}, {"pe_array.rows": 2, "pe_array.cols": 2}],
                         ids=["8x8", "2x2"])
def test_engines_agree_and_values_follow_the_documented_order(same_word, arch_changes):
    arch = variant(**arch_changes)
    rng = np.random.default_rng(0)
    n, slots = 96, 5  # few slots: copies hit the same rows in one cycle, runs of repeats combine
    idx = rng.integers(0, slots, n)
    idx[10:14] = idx[10]  # a run the register combines
    # large, cancelling magnitudes: float32 sums differ with the order, so order is tested
    v = (rng.standard_normal((n, LANES))
         * 10.0 ** rng.integers(-3, 8, (n, LANES))).astype(np.float32)
    mapping = map_program(scatter_acc_program(idx, v, slots, same_word), arch)
    (fast,), (ref,) = run_array(mapping, "fast"), run_array(mapping, "reference")
    assert fast.same_as(ref) == []
    km = mapping.kernels[0]
    got = dict(fast.outputs)["C"]
    want, flushes = replay(km, idx, v, slots, same_word)
    assert np.array_equal(got, want)  # bit for bit, the documented order
    # the order matters on this data: the same adds in reverse order give other bits
    words = np.broadcast_to(idx[:, None] * LANES + (0 if same_word else np.arange(LANES)), v.shape)
    backwards = np.zeros(slots * LANES, np.float32)
    np.add.at(backwards, words.ravel()[::-1], v.ravel()[::-1])
    assert not np.array_equal(backwards, want)
    np.testing.assert_allclose(got, backwards, rtol=1e-3, atol=1e-4 * np.abs(v).max())
    # one write access per flush whose lanes hit distinct words of one row; with all lanes on
    # one word each lane is its own access (serialised), so 8 per flush, and a line's single
    # write port needs at least 7 extra cycles per such flush
    writes = int(fast.spm_writes_per_line.sum())
    assert writes == flushes * (LANES if same_word else 1)
    if same_word:
        assert int(fast.spm_conflicts_per_line.sum()) >= flushes * (LANES - 1)
    assert fast.op_counts == ref.op_counts


def test_integer_data_is_exact_whatever_the_order(default_arch):
    """Small integers add exactly in float32, so C equals numpy's scatter-add exactly."""
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 3, 40)
    v = rng.integers(-50, 50, (40, LANES)).astype(np.float32)
    mapping = map_program(scatter_acc_program(idx, v, 3, True), default_arch)
    (res,) = run_array(mapping, "fast")
    want = np.zeros(3 * LANES, np.float64)
    np.add.at(want, np.repeat(idx * LANES, LANES), v.ravel())
    assert np.array_equal(dict(res.outputs)["C"], want.astype(np.float32))


def test_verifier_wants_an_index_and_a_loaded_one():
    prog = scatter_acc_program(np.array([0, 1]), np.ones((2, LANES)), 2, False)
    kern = prog.kernels[0]
    bad = Node(2, Op.SCATTER_ACC, (0, 1), buffer="C", addr=Addr((("j", 1),)), name="no index")
    with pytest.raises(DFGError, match="only gather/scatter/scatter_acc use an index"):
        Kernel(kern.name, kern.loops, (*kern.nodes[:2], bad), kern.buffers, "j").verify()
    computed = (kern.nodes[0], kern.nodes[1], Node(2, Op.ROUTE, (0,)),
                Node(3, Op.SCATTER_ACC, (2, 1), buffer="C", addr=Addr((("j", 1),), index_stride=8)))
    with pytest.raises(DFGError, match="scatter_acc needs a loaded index"):
        Kernel(kern.name, kern.loops, computed, kern.buffers, "j").verify()
