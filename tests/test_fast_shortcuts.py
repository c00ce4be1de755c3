"""Fidelity of the fast engine's shortcuts (validation ladder step 2; split from
tests/test_fidelity.py): the tile timing memo within and across runs
(docs/architecture.md#tile-timing-memo), the compiled fold, grouped MACC folds and batched
memo hits -- each on and off, and against the reference stepper: the same counters, values and
SimResult.
"""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.dfg.graph import vector_nodes
from dataflow.mapper import map_program
from dataflow.pe_array import fast_memo, fast_policy
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.testing import assert_close
from dataflow.ust_frontend.ops import as_tensor, lower_matmul
from tests.archs import fidelity_arch as arch
from tests.archs import variant
from tests.engine_checks import assert_engines_identical
from tests.engine_checks import assert_within_roofline as _roofline
from tests.programs import random_program

MANY_TILES = {"tiny-spm": {"spm.lines": 4, "spm.capacity_words_per_line": 256},
              "tiny-spm-xor": {"spm.lines": 4, "spm.capacity_words_per_line": 256,
                               "spm.address_mapping": "xor"},
              "tiny-spm-1port-queue": {"spm.lines": 2, "spm.capacity_words_per_line": 512,
                                       "spm.read_ports_per_line": 1,
                                       "spm.write_queue_depth": 2}}


def _memo_programs():
    from dataflow.dfg.lower import lower_gemm, lower_spmm_csr

    rng = np.random.default_rng(7)
    a = rng.standard_normal((40, 24), dtype=np.float32)
    b = rng.standard_normal((24, 20), dtype=np.float32)
    s = sp.random(48, 32, density=0.15, format="csr", dtype=np.float32, random_state=rng)
    s.sort_indices()
    d = rng.standard_normal((32, 12), dtype=np.float32)
    # every row with the same nonzero columns (values differ): CSR tiles whose patterns repeat
    row = np.zeros((1, 16), dtype=np.float32)
    row[0, [1, 6, 7, 12]] = 1
    rep = sp.csr_matrix(np.tile(row, (48, 1)) * rng.standard_normal((48, 1), dtype=np.float32))
    return {"gemm": lower_gemm(a, b), "spmm": lower_spmm_csr(s.shape, s.indptr, s.indices,
                                                             s.data, d),
            "spmm-repeat": lower_spmm_csr(rep.shape, rep.indptr, rep.indices, rep.data,
                                          d[:16])}


@pytest.mark.parametrize("preset", list(MANY_TILES))
@pytest.mark.parametrize("prog", ["gemm", "spmm", "spmm-repeat"])
def test_tile_memo_is_exact(preset, prog, monkeypatch):
    """Tile timing memo (`fast_memo._TimingMemo`): with it on, the fast engine still equals the
    reference stepper and equals itself with the memo off -- every counter, tile, value --
    on kernels of many tiles; and the memo is really taken somewhere in this corpus."""

    a = variant(**MANY_TILES[preset])
    mapping = map_program(_memo_programs()[prog], a)
    assert sum(len(km.tiles) for km in mapping.kernels) > 2
    monkeypatch.setenv(fast_memo.MEMO_ENV, "1")
    hits = fast_memo.MEMO_STATS["hits"]
    on = assert_engines_identical(mapping)
    taken = fast_memo.MEMO_STATS["hits"] - hits
    monkeypatch.setenv(fast_memo.MEMO_ENV, "0")
    hits = fast_memo.MEMO_STATS["hits"]
    off = simulate_mapping(mapping, "fast")
    assert fast_memo.MEMO_STATS["hits"] == hits  # off means off
    assert on.to_dict() == off.to_dict()
    assert np.array_equal(on.output, off.output)
    if preset == "tiny-spm" and prog in ("gemm", "spmm-repeat"):
        assert taken > 0, "the memo never hit: this test would not see it go wrong"


def test_tile_memo_rejects_a_shift_that_moves_lines():
    """A pattern shifted by one row (another line under the interleaved mapping) or by a
    multiple of the lines under the blocked one is not reused; a shift by whole line cycles
    under interleaving is; overlapping buffers with different shifts are not."""

    spm = variant().spm
    period = spm.words_per_row * spm.lines
    w = type("W", (), {"n": 4, "active": np.ones(4, dtype=np.int64)})()
    base = np.arange(4, dtype=np.int64) * 8

    def pattern(shift_a, shift_b=0):
        return [("A", base + shift_a, int(base[0] + shift_a), int(base[-1] + shift_a) + 7),
                ("B", base + 10_000 + shift_b, 10_000 + shift_b, 10_031 + shift_b)]

    memo = fast_memo._TimingMemo(spm)
    memo.remember(w, pattern(0), "counts", 3)
    assert memo.recall(w, pattern(0)) == ("counts", 3)
    assert memo.recall(w, pattern(period)) == ("counts", 3)
    assert memo.recall(w, pattern(spm.words_per_row)) is None
    assert memo.recall(w, pattern(period, 2 * period)) == ("counts", 3)  # disjoint buffers
    assert memo.recall(w, pattern(10_000 - 32, 0)) is None  # A would now overlap B's rows
    blocked = fast_memo._TimingMemo(variant(**{"spm.address_mapping": "blocked"}).spm)
    blocked.remember(w, pattern(0), "counts", 3)
    assert blocked.recall(w, pattern(period)) is None
    w2 = type("W", (), {"n": 4, "active": np.array([1, 8, 8, 8])})()
    assert memo.recall(w2, pattern(0)) is None  # other live lanes

@pytest.mark.parametrize("preset", list(MANY_TILES))
@pytest.mark.parametrize("prog", ["gemm", "spmm", "spmm-repeat"])
def test_tile_memo_across_runs_is_exact(preset, prog, monkeypatch):
    """The memo across runs (`fast_memo._RunMemo`): a second run of one mapping takes every tile's
    timing from the first run's, and equals the reference stepper and a run with it off."""

    mapping = map_program(_memo_programs()[prog], variant(**MANY_TILES[preset]))
    tiles = sum(len(km.tiles) for km in mapping.kernels)
    monkeypatch.setenv(fast_memo.MEMO_ENV, "1")
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "1")
    fast_memo.RUNS.clear()
    simulate_mapping(mapping, "fast")
    hits = fast_memo.MEMO_STATS["run_hits"]
    again = assert_engines_identical(mapping)  # two fast runs, each on the memo of the last
    assert fast_memo.MEMO_STATS["run_hits"] - hits == 2 * tiles
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "0")
    hits = fast_memo.MEMO_STATS["run_hits"]
    off = simulate_mapping(mapping, "fast")
    assert fast_memo.MEMO_STATS["run_hits"] == hits  # off means off
    assert again.to_dict() == off.to_dict() and np.array_equal(again.output, off.output)


def test_tile_memo_across_runs_stays_within_its_budget(monkeypatch):
    """A budget smaller than the kernels' patterns: entries beyond it are not kept, what is
    kept stays under it, and the runs still equal the memo off."""

    mapping = map_program(_memo_programs()["spmm"], variant(**MANY_TILES["tiny-spm"]))
    monkeypatch.setattr(fast_memo._RunMemo, "KEEP_BYTES", 8192)
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "1")
    fast_memo.RUNS.clear()
    on = [simulate_mapping(mapping, "fast") for _ in range(2)]
    (kept,) = fast_memo.RUNS.kernels.values()
    assert 0 < fast_memo.RUNS.held <= 8192 and 0 < len(kept) < len(mapping.kernels[0].tiles)
    kernels = fast_memo.RUNS.kernels.values()
    assert fast_memo.RUNS.held == sum(fast_memo._entry_bytes(e) for t in kernels
                                      for e in t.values())
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "0")
    off = simulate_mapping(mapping, "fast")
    assert all(r.to_dict() == off.to_dict() for r in on)
    fast_memo.RUNS.clear()


def _spmm_with_columns(columns, seed=3, per_row=lambda r: 4):
    """A 32 x 64 CSR SpMM by a 64 x 8 B, `per_row(row)` nonzeros in each row (four unless
    given) at `columns(row)`."""
    from dataflow.dfg.lower import lower_spmm_csr

    rng = np.random.default_rng(seed)
    crd = np.concatenate([columns(r)[:per_row(r)] for r in range(32)]).astype(np.int64)
    pos = np.concatenate(([0], np.cumsum([per_row(r) for r in range(32)]))).astype(np.int64)
    return lower_spmm_csr((32, 64), pos, crd, rng.standard_normal(len(crd), dtype=np.float32),
                          rng.standard_normal((64, 8), dtype=np.float32))


def _csr_product(prog):
    """The SpMM `prog` computes, in float64 from its inputs (pos, crd, val, B)."""
    ins = dict(prog.inputs)
    pos = dict(prog.kernels[0].domain_arrays)
    (_, ptr), = pos.items()
    a = sp.csr_matrix((ins["A_val"], ins["A_crd"], ptr), shape=(32, 64)).toarray()
    return a.astype(np.float64) @ ins["B"].reshape(64, 8).astype(np.float64)


def test_tile_memo_across_runs_sees_other_addresses(monkeypatch):
    """One kernel mapping run on two programs whose gathers read other rows of B: the second
    run's tiles must not take the first run's timing (their compute cycles differ), and
    a memo that handed back another run's timing is caught (stall entries corrupted)."""
    from dataflow.mapper.mapping import Mapping

    a = variant(**MANY_TILES["tiny-spm"])
    spread = _spmm_with_columns(lambda r: np.array([0, 17, 34, 51]) + r % 8)
    runs = _spmm_with_columns(lambda r: np.arange(4) + 4 * (r % 16))  # rows sharing lines
    mapping = map_program(spread, a)
    other = Mapping(program=runs, arch=a, kernels=mapping.kernels)
    monkeypatch.setenv(fast_memo.MEMO_ENV, "1")
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "1")
    fast_memo.RUNS.clear()
    first = simulate_mapping(mapping, "fast")
    second = assert_engines_identical(other)
    assert first.compute_cycles != second.compute_cycles, "they must time apart for this test"
    # a memo whose entries lie is used (the cycles move), so the checks above could fail
    for tiles in fast_memo.RUNS.kernels.values():
        for ti, (n, active, pattern, counts, stall) in list(tiles.items()):
            tiles[ti] = (n, active, pattern, counts, stall + 1)
    lied = simulate_mapping(other, "fast")
    assert lied.compute_cycles > second.compute_cycles
    # other row lengths (another kernel's domain arrays) on a mapping the memo cannot tell
    # apart from the first: the tiles' domains an earlier run left are not reused
    ragged = _spmm_with_columns(lambda r: np.arange(6) * 8 + r % 8,
                                per_row=lambda r: 2 + 4 * (r % 2))  # nnz stays 128
    third_map = map_program(ragged, a)
    assert fast_memo.RUNS.key(third_map.kernels[0], a) == fast_memo.RUNS.key(mapping.kernels[0], a)
    simulate_mapping(mapping, "fast")
    third = assert_engines_identical(third_map)
    assert_close(np.asarray(third.output).reshape(32, 8), _csr_product(ragged))
    fast_memo.RUNS.clear()


def test_engines_identical_on_line_aware_schedules():
    """A kernel whose copies the line-aware reservation table delayed, and an SDDMM whose lane
    sums are blocked (docs/conventions.md#sparse-line-model): identical counters, values and
    SimResult."""
    from dataflow.plan.compile import choose_schedule
    from tests.test_sparse_lines import DEFAULT, _sddmm, line_scheduled_elementwise

    _, want, _, lined = line_scheduled_elementwise()
    res = assert_engines_identical(lined)
    assert np.array_equal(np.asarray(res.output).reshape(want.shape), want)
    _roofline(res, DEFAULT)
    prog, want = _sddmm(seed=1)
    mapping, sched = choose_schedule(prog, DEFAULT)
    assert sched is not None and sched.kernels[0].reduce_lanes
    res = assert_engines_identical(mapping)
    assert np.allclose(np.asarray(res.output), want, rtol=1e-4, atol=1e-4)
    _roofline(res, DEFAULT)


@pytest.mark.parametrize("preset", ["default", "2x2-1port", "lanes4-torus"])
@pytest.mark.parametrize("prog", ["gemm-macc", "spmm", "random"])
def test_compiled_fold_is_exact(preset, prog, monkeypatch):
    """The compiled loops (`fast_fold._fold_loops`, `_macc_fold_loops` with the product fused, and
    `_read_count_loops`, reads per (cycle, line) with one access per row and cycle) against
    the reference stepper, and the same result and bits as numpy's."""
    from dataflow.plan.compile import compile_program

    rng = np.random.default_rng(11)
    if prog == "gemm-macc":  # the planned outer-product GEMM: MACC nodes
        a = as_tensor(rng.standard_normal((24, 40), dtype=np.float32))
        mapping = compile_program(lower_matmul(
            a, as_tensor(rng.standard_normal((40, 20), dtype=np.float32))), arch(preset))
        assert any(n.op.value == "macc" for km in mapping.kernels for n in km.kernel.nodes)
    elif prog == "spmm":
        mapping = map_program(_memo_programs()["spmm"], arch(preset))
    else:
        mapping = map_program(random_program(5), arch(preset))
    monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, "always")
    on = assert_engines_identical(mapping)
    monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, "0")
    off = simulate_mapping(mapping, "fast")
    assert on.to_dict() == off.to_dict()
    assert np.array_equal(on.output, off.output)


@pytest.mark.parametrize("jit", ["always", "0"])
def test_shared_address_sums_are_exact(jit, monkeypatch):
    """Nodes of one affine term set share the tile's address sum, flush iterations and memo
    base (`fast._affine_base`, docs/architecture.md#sharing-and-compiled-gathers; in a dense
    nest broadcast along the loop axes): the planned GEMM's MACCs differ only by constants, so
    they share one, and the fast engine equals the reference stepper with the compiled gather
    on and off; a sum along the wrong axes fails it."""
    from dataflow.pe_array import fast
    from dataflow.plan.compile import compile_program

    rng = np.random.default_rng(13)
    a = as_tensor(rng.standard_normal((24, 40), dtype=np.float32))
    mapping = compile_program(lower_matmul(
        a, as_tensor(rng.standard_normal((40, 20), dtype=np.float32))), arch("default"))
    km = mapping.kernels[0]
    ctx = type("C", (), {"km": km, "vec": frozenset(vector_nodes(km.kernel)),
                         "terms": {}})()
    terms = [fast._affine_terms(ctx, n) for n in km.kernel.nodes if n.op.value == "macc"]
    assert len(terms) > 1 and len(set(terms)) < len(terms)  # really shared
    monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, jit)
    assert_engines_identical(mapping)


def test_accumulators_of_two_term_sets_flush_apart():
    """Two accumulators of one tile whose addresses have different loop terms (row sums into
    R[i], column sums into S[kk]) flush at their own run ends: the flush iterations shared
    per term set (`fast._flushes`) must not leak from one set to the other."""
    from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
    from dataflow.dfg.lower import run_passes
    from dataflow.dfg.ops import Op

    x = np.random.default_rng(17).standard_normal(512).astype(np.float32)
    nodes = (Node(0, Op.LOAD, (), buffer="X", addr=Addr((("i", 64), ("kk", 1)))),
             Node(1, Op.ACC, (0,), buffer="R", addr=Addr((("i", 1),))),
             Node(2, Op.ACC, (0,), buffer="S", addr=Addr((("kk", 1),))))
    kernel = Kernel(name="sums", loops=(Loop("i", 8), Loop("kk", 64)), nodes=nodes,
                    buffers=(Buffer("X", 512), Buffer("R", 8, "output"),
                             Buffer("S", 64, "output")), carried=((1, 1, 1), (2, 2, 1)))
    prog = run_passes(Program(name="sums", kernels=(kernel,), inputs=(("X", x),),
                              outputs=(("R", (8,)), ("S", (64,)))))
    mapping = map_program(prog, arch("default"))
    km = mapping.kernels[0]
    assert max(t.hi - t.lo for t in km.tiles) * 64 > 2 * km.copies  # runs longer than 1
    res = assert_engines_identical(mapping)
    assert np.allclose(np.asarray(res.output).ravel()[:8], x.reshape(8, 64).sum(axis=1),
                       atol=1e-4)


@pytest.mark.parametrize("preset", ["default", "lanes4-torus"])
def test_grouped_macc_fold_is_exact(preset, monkeypatch):
    """The planned GEMM's MACCs (one lane of A each, times B's lanes) fold as one group in one
    compiled call (`fast_fold.group_macc_fold`, called from `fast`): equal to the reference
    stepper, and to the fast engine folding them one by one (DATAFLOW_MACC_GROUPS=0), every
    field and bit; the group path is really taken."""
    from dataflow.pe_array import fast, fast_fold
    from dataflow.plan.compile import compile_program

    rng = np.random.default_rng(19)
    a = as_tensor(rng.standard_normal((24, 40), dtype=np.float32))
    mapping = compile_program(lower_matmul(
        a, as_tensor(rng.standard_normal((40, 20), dtype=np.float32))), arch(preset))
    calls = []
    group_fold = fast.group_macc_fold

    def counted(*args):
        calls.append(args[3].id)
        return group_fold(*args)

    monkeypatch.setattr(fast, "group_macc_fold", counted)
    monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, "always")
    monkeypatch.setenv(fast_fold.MACC_GROUPS_ENV, "1")
    monkeypatch.setenv("DATAFLOW_TILE_BATCH", "0")  # memo hits tile by tile (`fast_tile.py`)
    on = assert_engines_identical(mapping)
    assert len(set(calls)) > 1, "no MACC group folded: this test would not see it go wrong"
    monkeypatch.setenv(fast_fold.MACC_GROUPS_ENV, "0")
    off = simulate_mapping(mapping, "fast")
    assert on.to_dict() == off.to_dict()
    assert np.array_equal(np.asarray(on.output).view(np.int32),
                          np.asarray(off.output).view(np.int32))


def test_writes_of_two_ops_into_one_buffer_commit_in_order():
    """A store and an accumulate into one word of a buffer, beside an accumulate into another
    buffer: the fast engine commits each buffer's updates in commit order (one call per run of
    one op; buffers apart, `fast._apply_writes`), equal to the reference stepper; committing a
    buffer's stores before its accumulates (grouping by op) fails it."""
    from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
    from dataflow.dfg.lower import run_passes
    from dataflow.dfg.ops import Op

    x = np.random.default_rng(23).standard_normal(256).astype(np.float32)
    nodes = (Node(0, Op.LOAD, (), buffer="X", addr=Addr((("i", 64), ("kk", 1)))),
             Node(1, Op.STORE, (0,), buffer="Y", addr=Addr(())),
             Node(2, Op.ACC, (0,), buffer="Y", addr=Addr(())),
             Node(3, Op.ACC, (0,), buffer="Z", addr=Addr((("i", 1),))))
    kernel = Kernel(name="mixed", loops=(Loop("i", 4), Loop("kk", 64)), nodes=nodes,
                    buffers=(Buffer("X", 256), Buffer("Y", 1, "output"),
                             Buffer("Z", 4, "output")), carried=((2, 2, 1), (3, 3, 1)))
    prog = run_passes(Program(name="mixed", kernels=(kernel,), inputs=(("X", x),),
                              outputs=(("Y", (1,)), ("Z", (4,)))))
    assert_engines_identical(map_program(prog, arch("default")))


def _fused_attention(seq=96, dim=64):
    """The attention as the planned workload runs it (scores in one body, the row maximum
    folded into them): three kernels, gathers indexed by the mask's columns."""
    import dataclasses

    from dataflow.attention.api import make_inputs
    from dataflow.attention.lower import lower_attention
    from dataflow.dfg import transform
    from dataflow.plan.compile import KernelSchedule, apply_kernel_schedule

    x = make_inputs("window", seq, dim, 0)
    prog = lower_attention(x["q"], x["k"], x["v"], x["pos"], x["crd"], lanes=8)
    blocked = apply_kernel_schedule(prog.kernels[0], KernelSchedule(sum_blocks=8, hold=8))
    return transform.fuse_row_max(dataclasses.replace(prog, kernels=(blocked,
                                                                     *prog.kernels[1:])), 8)


def _total_sum(rows=48, cols=16, seed=5):
    """T[0] += X[i, kk]: one accumulator address over the whole domain, so on one copy a run
    reaches from one tile into the next unless tile ends flush it."""
    from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node, Program
    from dataflow.dfg.lower import run_passes
    from dataflow.dfg.ops import Op

    # magnitudes far apart: where the register is flushed changes the float32 sum
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(rows * cols) * 10.0 ** rng.uniform(-3, 3, rows * cols)).astype(
        np.float32)
    nodes = (Node(0, Op.LOAD, (), buffer="X", addr=Addr((("i", cols), ("kk", 1)))),
             Node(1, Op.ACC, (0,), buffer="T", addr=Addr(())))
    kernel = Kernel(name="total", loops=(Loop("i", rows), Loop("kk", cols)), nodes=nodes,
                    buffers=(Buffer("X", rows * cols), Buffer("T", 1, "output")),
                    carried=((1, 1, 1),))
    return run_passes(Program(name="total", kernels=(kernel,), inputs=(("X", x),),
                              outputs=(("T", (1,)),)))


@pytest.mark.parametrize("jit", ["0", "always"])
@pytest.mark.parametrize("prog", ["attention", "spmm", "gemm", "total"])
def test_batched_memo_hits_are_exact(prog, jit, monkeypatch):
    """Memo-hit tiles computed in one pass (`fast_tile.py`; numpy with DATAFLOW_FOLD_JIT=0,
    the compiled loop of `fast_tile_jit.py` with =always): a warm run equals the reference
    stepper and the tile-by-tile path (DATAFLOW_TILE_BATCH=0), every counter, tile and bit,
    and the pass is really taken. "total" keeps one accumulator address across tiles on one
    copy: a pass that forgot to flush at tile ends would commit other float32 sums."""
    from dataflow.pe_array import fast_tile

    if prog == "attention":
        mapping = map_program(_fused_attention(), arch("default"))
    elif prog == "total":
        mapping = map_program(_total_sum(), variant(**{"pe_array.rows": 1, "pe_array.cols": 1,
                                                       **MANY_TILES["tiny-spm"]}))
        km = mapping.kernels[0]
        assert km.copies == 1 and len(km.tiles) > 2
        x = dict(mapping.program.inputs)["X"]
        whole = np.add.accumulate(x, dtype=np.float32)[-1]  # one register over every tile
        per_tile = np.float32(0)
        for t in km.tiles:
            per_tile += np.add.accumulate(x[t.lo * 16:t.hi * 16], dtype=np.float32)[-1]
        assert whole != per_tile  # so a run reaching across tiles would show
    else:
        mapping = map_program(_memo_programs()[prog], variant(**MANY_TILES["tiny-spm"]))
    assert any(len(km.tiles) > 1 for km in mapping.kernels)
    monkeypatch.setenv(fast_memo.MEMO_ENV, "1")
    monkeypatch.setenv(fast_memo.RUNS_MEMO_ENV, "1")
    monkeypatch.setenv(fast_policy.FOLD_JIT_ENV, jit)
    monkeypatch.setenv(fast_tile.BATCH_ENV, "1")
    fast_memo.RUNS.clear()
    simulate_mapping(mapping, "fast")  # the memo across runs now knows every tile
    before = dict(fast_tile.BATCH_STATS)
    on = assert_engines_identical(mapping)
    assert fast_tile.BATCH_STATS["tiles"] > before["tiles"]
    if jit == "always" and prog != "attention":  # attention's exp kernel stays in numpy
        assert fast_tile.BATCH_STATS["compiled"] > before["compiled"]
    monkeypatch.setenv(fast_tile.BATCH_ENV, "0")
    before = dict(fast_tile.BATCH_STATS)
    off = simulate_mapping(mapping, "fast")
    assert fast_tile.BATCH_STATS == before  # off means off
    assert on.to_dict() == off.to_dict() and np.array_equal(on.output, off.output)
    fast_memo.RUNS.clear()


def test_batched_pass_refuses_a_kernel_that_reads_what_it_writes():
    """A load of a buffer the kernel also writes would see other tiles' updates tile by tile
    but not in one pass: such a kernel (which `Kernel.verify` rejects anyway) is never
    batched, nor one whose index is computed rather than loaded."""
    from types import SimpleNamespace

    from dataflow.dfg.graph import Addr, Node
    from dataflow.dfg.ops import Op
    from dataflow.pe_array import fast_tile

    def ctx(*nodes):
        kernel = SimpleNamespace(nodes=nodes)
        return SimpleNamespace(km=SimpleNamespace(kernel=kernel, tiles=(0, 1)))

    memo = fast_memo._TimingMemo(arch("default").spm)
    load = Node(0, Op.LOAD, (), buffer="Y", addr=Addr((("i", 1),), const=1))
    assert fast_tile.batch_applies(ctx(load, Node(1, Op.STORE, (0,), buffer="Z",
                                                  addr=Addr((("i", 1),)))), memo)
    assert not fast_tile.batch_applies(ctx(load, Node(1, Op.STORE, (0,), buffer="Y",
                                                      addr=Addr((("i", 1),)))), memo)
    computed = (load, Node(1, Op.ADD, (0, 0)),
                Node(2, Op.GATHER, (1,), buffer="X", addr=Addr((), index_stride=1)))
    assert not fast_tile.batch_applies(ctx(*computed), memo)
