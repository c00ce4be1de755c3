"""Four-step split of FFTs too long for one SPM tile (`butterfly.ops.run_fft_spec`): values
against numpy, the column pass's kernels against their closed forms, DRAM bytes against the
two passes' closed forms, and the automatic choice of the split."""

import dataclasses

import numpy as np
import pytest

from dataflow.butterfly import reference as ref
from dataflow.butterfly.ops import run_fft, run_fft_spec, run_fnet_attention
from dataflow.dfg.graph import DFGError
from dataflow.dfg.lower_butterfly import ButterflySpec, group_kernel, lower_butterfly, split_stages
from dataflow.mapper import MappingError
from dataflow.plan.orchestrate import (
    SPMCapacityError,
    minimal_dram_bytes,
    plan_orchestration,
    round_trips,
)
from dataflow.testing import values_match
from tests.test_butterfly import mlx_variant


@pytest.fixture(scope="module")
def mlx():
    return mlx_variant()


@pytest.fixture(scope="module")
def small_spm():
    # 8 lines x 1536 words = 12288 words: a 256-point complex tile of 8 lanes, double-buffered
    # in and out, needs 16384
    return mlx_variant(**{"spm.capacity_words_per_line": 1536})


def _spec(n, batch, cplx):
    return ButterflySpec(n=n, batch=batch, lanes=8, kind="fft", bitrev_input=True,
                         real_input=not cplx)


def _x(rng, batch, n, cplx):
    x = rng.standard_normal((batch, n)).astype(np.float32)
    return x + 1j * rng.standard_normal((batch, n)).astype(np.float32) if cplx else x


@pytest.mark.parametrize("n,batch,a,cplx,mode", [
    (64, 8, 3, False, "multilayer"), (128, 16, 4, True, "layer"), (128, 8, 5, True, "fused"),
    (256, 3, 3, False, "multilayer")])
def test_split_values_equal_numpy(mlx, n, batch, a, cplx, mode):
    x = _x(np.random.default_rng(n + a), batch, n, cplx)
    run = run_fft_spec(_spec(n, batch, cplx), x, mlx, mode, split=a)
    assert values_match(run.outputs["y"], np.fft.fft(x, axis=-1))
    assert any("four-step" in s for s in run.result.notes)
    assert len({s.residency for s in run.spans}) >= 2  # two passes, at least one residency each


def test_split_dram_bytes_are_the_two_passes(mlx):
    """The split moves the data through DRAM twice: pass A reads the input and writes the
    complex intermediate, pass B reads it and writes the result, each with its tables (closed
    forms `minimal_dram_bytes`, an upper bound: they count every table word). Pass B's tables
    C5..C7 are always loaded (its twiddles depend on k1); pass A's T0..T4 only where a twiddle
    is not a constant of the fused kernel."""
    n, batch, a = 256, 16, 5
    spec = _spec(n, batch, False)
    x = _x(np.random.default_rng(1), batch, n, False)
    run = run_fft_spec(spec, x, mlx, "multilayer", split=a)
    sa = dataclasses.replace(spec, n=1 << a, batch=batch * (n >> a))
    sb = dataclasses.replace(spec, n=n >> a, batch=batch << a, real_input=False, col_bits=a)
    data = 4 * batch * n * (1 + 2 + 2 + 2)  # real in, complex out, complex in, complex out
    most = minimal_dram_bytes(sa, 4) + minimal_dram_bytes(sb, 4)
    assert data < run.result.dram_bytes <= most
    tables = (run.result.dram_bytes - data) // 4
    cols = 2 * ((1 << a) + 8) * (1 + 2 + 4)  # C5..C7: 2^j (re, im) blocks of 2^a + 8 words
    assert cols <= tables <= cols + 2 * (1 + 2 + 4 + 8 + 16)
    whole = run_fft_spec(spec, x, mlx, "multilayer")
    assert whole.result.dram_bytes < run.result.dram_bytes  # the split's price: a round trip
    # the roofline of the chain is the sum of the passes' and never above the cycles
    assert run.bounds["bound"] <= run.result.cycles


def test_column_pass_kernel_twiddles_and_loops():
    """Stage j of the column pass reads table C(a+j) with one contiguous vector load per part
    (k1 = kh lanes + bi) from block 2 pos + part of 2^a + L words (pos: the twiddle's place,
    `twiddle_position`); its loops are b, kh, the point bits and the lanes."""
    a, n, L = 4, 8, 8
    blk = (1 << a) + L
    spec = ButterflySpec(n=n, batch=3 << a, lanes=L, kind="fft", bitrev_input=True, col_bits=a)
    spec.verify()
    assert (spec.col_blocks, spec.outer) == (2, 3)
    groups = split_stages(spec.stages, 1)
    for j, g in enumerate(groups):
        k = group_kernel(spec, g, len(groups), j)
        assert [lp.var for lp in k.loops][:2] == ["bo", "kh"]
        assert k.loops[0].extent == 3 and k.loops[1].extent == 2
        tw = [nd for nd in k.nodes if nd.buffer == f"C{a + j}"]
        assert len(tw) == 2  # re, im: one twiddle per pair (f = 1)
        for q, nd in enumerate(sorted(tw, key=lambda nd: nd.addr.const)):
            assert nd.addr.coef("bi") == 1 and nd.addr.coef("kh") == L
            assert nd.addr.const == q * blk
            # one stage per kernel: the o bits (below the stage) are the twiddle's place
            for t in range(j):
                assert nd.addr.coef(f"o{t}") == 2 * blk << t
        buf = {b.name: b.size for b in k.buffers}
        assert buf[f"C{a + j}"] == 2 * blk << j


def test_twiddles_of_one_iteration_sit_side_by_side():
    """In a fused group from stage k0, stage k's 2^(k-k0) twiddles differ only in index bits
    k0 .. k-1, which `twiddle_position` puts at the bottom: one iteration reads adjacent table
    entries (one SPM row) instead of entries 2^k0 apart (all on one SPM line), and the table
    still holds every twiddle once."""
    from dataflow.dfg.lower_butterfly import StageGroup, twiddle_position

    k0, f, n = 3, 3, 64
    spec = ButterflySpec(n=n, batch=8, lanes=8, kind="fft", bitrev_input=True)
    kern = group_kernel(spec, StageGroup(k0, f), 2, 1)
    for k in range(k0, k0 + f):
        loads = [nd for nd in kern.nodes if nd.buffer == f"T{k}"]
        assert len(loads) == 2 << (k - k0)
        consts = sorted(nd.addr.const for nd in loads)
        assert consts == list(range(len(loads)))  # (re, im) of 2^(k-k0) neighbours
        pos = twiddle_position(np.arange(1 << k), k, k0)
        assert sorted(pos.tolist()) == list(range(1 << k))  # a permutation of the table


def test_column_pass_tables_hold_the_big_ffts_twiddles():
    """C(a+j) holds W_(2^(a+j+1))^(i 2^a + k1) for every (i < 2^j, k1 < 2^a) at block
    2 pos(i) + part, word k1 (blocks of 2^a + lanes words; the spare words stay zero)."""
    from dataflow.dfg.lower_butterfly import twiddle_position

    a, L = 3, 8
    blk = (1 << a) + L
    spec = ButterflySpec(n=4, batch=8, lanes=L, kind="fft", bitrev_input=True, col_bits=a)
    prog = lower_butterfly(spec, split_stages(2, 2), np.zeros((8, 4), np.complex64))
    tables = dict(prog.inputs)
    for j in range(2):
        K = a + j
        t = tables[f"C{K}"].reshape(1 << j, 2, blk)
        i = np.arange(1 << j)
        w = np.exp(-2j * np.pi * (i[:, None] * (1 << a) + np.arange(1 << a)) / (2 << K))
        pos = twiddle_position(i, j, 0)  # the group of both stages starts at stage 0
        np.testing.assert_allclose(t[pos, 0, : 1 << a] + 1j * t[pos, 1, : 1 << a], w, atol=1e-7)
        assert not t[:, :, 1 << a:].any()


def test_column_pass_spec_is_checked():
    with pytest.raises(DFGError, match="col_bits"):
        ButterflySpec(n=8, batch=16, lanes=8, kind="real", col_bits=4).verify()
    with pytest.raises(DFGError, match="col_bits"):
        ButterflySpec(n=8, batch=16, lanes=8, kind="fft", col_bits=2).verify()  # 4 < lanes
    with pytest.raises(DFGError, match="col_bits"):
        ButterflySpec(n=8, batch=24, lanes=8, kind="fft", col_bits=4).verify()  # 24 % 16


def test_split_is_automatic_when_the_tile_does_not_fit(small_spm, mlx):
    x = _x(np.random.default_rng(7), 8, 256, True)
    spec = _spec(256, 8, True)
    with pytest.raises(SPMCapacityError):
        plan_orchestration(spec, small_spm, "layer")
    y, run = run_fft(x, small_spm, "multilayer")
    assert values_match(y, np.fft.fft(x, axis=-1))
    # the split with the fewest DRAM round trips (closed form), the largest n1 among equals
    trips = {}
    for a in range(3, 8):
        sa = dataclasses.replace(spec, n=1 << a, batch=8 << (8 - a))
        sb = dataclasses.replace(spec, n=256 >> a, batch=8 << a, real_input=False, col_bits=a)
        try:
            trips[a] = sum(round_trips(s, small_spm, "multilayer") for s in (sa, sb))
        except SPMCapacityError:
            pass
    assert 7 in trips  # a 128-point tile fits pass A
    best = min(trips, key=lambda a: (trips[a], -a))
    assert trips[best] < trips[7]  # ... but 128 x 2 would take more round trips
    assert any(f"256 = {1 << best} x {256 >> best}" in s and f"round trips, {trips[best]})" in s
               for s in run.result.notes)
    # where the whole length fits there is no split
    _, whole = run_fft(x, mlx, "multilayer")
    assert not any("four-step" in s for s in whole.result.notes)


def test_fnet_splits_the_sequence_pass(small_spm):
    x = np.random.default_rng(3).standard_normal((256, 16)).astype(np.float32)
    y, res, runs = run_fnet_attention(x, small_spm, "multilayer")
    assert values_match(y, ref.fnet_attention(x))
    assert not any("four-step" in s for s in runs[0].result.notes)  # 16-point hidden pass
    assert any("four-step" in s for s in runs[1].result.notes)
    assert res.cycles <= runs[0].result.cycles + runs[1].result.cycles  # one timeline
    assert sum(r.bounds["bound"] for r in runs) <= res.cycles


def test_no_split_fits_gives_the_capacity_error():
    tiny = mlx_variant(**{"spm.capacity_words_per_line": 512})  # 4096 words: B's tile is 2n x 4
    with pytest.raises(MappingError, match="does not fit the SPM"):
        run_fft(np.ones((8, 1024), np.float32), tiny, "layer")


def test_trivial_twiddles_need_no_multiply():
    """A radix-8 group from stage 0: w = 1 (stage 0, half of stage 1) and w = -i (the other
    half of stage 1, one pair of stage 2) go straight to the butterfly unit; only stage 2's
    w = exp(-i pi/4) and exp(-3i pi/4) multiply: 2 complex multiplies = 2 MUL + 2 MAC each,
    one of the MACs negating (re = wr xr - wi xi)."""
    from dataflow.dfg.lower_butterfly import StageGroup
    from dataflow.dfg.ops import Op

    spec = ButterflySpec(n=8, batch=8, lanes=8, kind="fft", bitrev_input=True)
    k = group_kernel(spec, StageGroup(0, 3), 1, 0)
    ops = [nd.op for nd in k.nodes]
    assert ops.count(Op.MUL) == 4 and ops.count(Op.MAC) == 4
    assert sum(1 for nd in k.nodes if nd.op is Op.MAC and nd.value < 0) == 2
    assert ops.count(Op.BFLY) == 3 * 4 * 2 * 2  # stages x pairs x (up, down) x (re, im)
    assert not any(nd.op is Op.LOAD and nd.buffer.startswith("T") for nd in k.nodes)
    x = (np.random.default_rng(0).standard_normal((8, 8))
         + 1j * np.random.default_rng(1).standard_normal((8, 8)))
    run = run_fft_spec(spec, x.astype(np.complex64), mlx_variant(), "fused")
    assert values_match(run.outputs["Yr"].reshape(8, 8).T + 1j * run.outputs["Yi"].reshape(8, 8).T,
                        np.fft.fft(x, axis=-1))


def test_negating_mac_subtracts_the_product():
    from dataflow.dfg.ops import Op
    from dataflow.pe_array.semantics import apply_op

    args = [np.float32(2), np.float32(3), np.float32(10)]
    assert apply_op(Op.MAC, args, np.float32) == 16
    assert apply_op(Op.MAC, args, np.float32, 1.0) == 16
    assert apply_op(Op.MAC, args, np.float32, -1.0) == 4
