"""Ramped tiles (docs/conventions.md#ramped-tiles): a kernel's first and last tiles cut smaller
so its DMA prologue and epilogue overlap compute sooner. Values equal numpy, cycles never below
the roofline, fewer cycles than the same schedule unramped, and the tiles cover the loop once."""

import numpy as np
import pytest
import scipy.sparse as sp

from dataflow.arch import load_arch
from dataflow.dfg.lower import lower_spmm_csr
from dataflow.mapper.legality import check_mapping
from dataflow.mapper.tiling import tile_and_allocate, tiles_at
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.plan import nonzero_choice, tile_ramp
from dataflow.plan.compile import choose_schedule
from dataflow.testing import values_match
from tests.conftest import ARCH_DIR

DEFAULT = load_arch(ARCH_DIR / "default.yaml")


def _spmm(m=2048, k=1024, n=64, density=0.04, seed=0):
    rng = np.random.default_rng(seed)
    a = sp.random(m, k, density=density, format="csr", dtype=np.float32, random_state=rng)
    b = rng.standard_normal((k, n), dtype=np.float32)
    prog = lower_spmm_csr((m, k), a.indptr, a.indices, a.data, b)
    return prog, (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


@pytest.fixture(scope="module")
def runs():
    """(ramped, unramped) (mapping, result) of one CSR SpMM whose first tile loads 41 nonzeros
    a row and whose last writes 64 columns a row: both ends worth ramping."""
    prog, want = _spmm()
    out = []
    for ramp in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            # one schedule ramped and not: the nonzero unroll (chosen on measured first
            # tiles, which the ramp changes) is left out (docs/conventions.md#nonzero-unroll)
            mp.setattr(nonzero_choice, "UNROLLS", ())
            if not ramp:
                mp.setattr(tile_ramp, "ramp_tiles", lambda km, *a, **k: km)
            mapping, _ = choose_schedule(prog, DEFAULT)
        out.append((mapping, simulate_mapping(mapping)))
    return out, want


def test_ramped_spmm_values_roofline_and_fewer_cycles(runs):
    (ramped, r), (plain, p) = runs[0]
    want = runs[1]
    for res in (r, p):
        assert values_match(np.asarray(res.output).reshape(want.shape), want)
        assert res.cycles >= res.roofline_cycles
    # the same schedule, its ends cut smaller: the array starts sooner, the run ends sooner
    assert ramped.kernels[0].ii == plain.kernels[0].ii
    assert r.cycles < 0.98 * p.cycles
    assert r.stall_cycles_dram < p.stall_cycles_dram


def test_ramped_tiles_cover_the_loop_once_inside_the_tiles(runs):
    (ramped, _), (plain, _) = runs[0]
    km, orig = ramped.kernels[0], plain.kernels[0]
    check_mapping(ramped)  # every ramped window inside its allocation
    extent = km.kernel.loops[0].extent
    assert km.tiles[0].lo == 0 and km.tiles[-1].hi == extent
    assert all(a.hi == b.lo and a.lo < a.hi for a, b in zip(km.tiles, km.tiles[1:]))
    assert len(km.tiles) > len(orig.tiles)
    sizes = [t.hi - t.lo for t in km.tiles]
    assert sizes[0] < sizes[-len(km.tiles) // 2] and sizes[-1] < sizes[len(km.tiles) // 2]
    # the first pieces double up to a whole tile; every piece inside one of the mapper's tiles
    assert sizes[1] <= 2 * sizes[0] and sizes[2] == 2 * sizes[1]
    for t in km.tiles:
        assert any(o.lo <= t.lo and t.hi <= o.hi for o in orig.tiles)
    assert any("ramped tiles" in n for n in km.notes)
    # a program's inner ends are left alone: a later kernel's first tile is prefetched, an
    # earlier one's write-backs drain behind the next kernel
    slow = lambda: 1e3  # noqa: E731 (cycles per iteration: the DMA keeps up)
    first, last = orig.tiles[0], orig.tiles[-1]
    both = tile_ramp.ramp_bounds(orig, DEFAULT, slow)
    assert min(both) < first.hi and max(both) > last.lo
    assert min(tile_ramp.ramp_bounds(orig, DEFAULT, slow, head=False)) == first.hi
    assert max(tile_ramp.ramp_bounds(orig, DEFAULT, slow, tail=False)) == last.lo


def test_tiles_at_the_mappers_bounds_are_the_mappers_tiles():
    prog, _ = _spmm(m=256, k=256, density=0.05)
    kernel = prog.kernels[0]
    tiles, _ = tile_and_allocate(kernel, DEFAULT)
    assert len(tiles) > 2
    assert tiles_at(kernel, DEFAULT, [t.lo for t in tiles[1:]]) == tiles
    with pytest.raises(ValueError, match="not increasing"):
        tiles_at(kernel, DEFAULT, [0])


def test_ramp_steps_and_when_the_dma_keeps_up():
    # each halving hides half the exposed transfer left, for one more tile's fill
    assert tile_ramp.ramp_steps(1000, 512, 100) == 3  # 500, 250, 125 > 100; 62.5 is not
    assert tile_ramp.ramp_steps(150, 512, 100) == 0
    assert tile_ramp.ramp_steps(10 ** 6, 4, 1) == 2  # pieces keep a row
    # a piece's loads, twice the last's, land while the last computes beside its write-back
    assert tile_ramp.keeps_up(6.4, 5.0, 21.6)  # the CSR SpMM of issue 13 on default.yaml
    assert not tile_ramp.keeps_up(3.1, 5.0, 10.9)
    assert not tile_ramp.keeps_up(0.0, 5.0, 10.9)



def test_sample_cycles_memo_is_keyed_on_content(monkeypatch, tmp_path):
    """A warm re-plan takes the ramp's measured tile from the memo (no second run of the
    tile), a new process from the file on disk; a program with any array changed is measured
    afresh, so a hit is the same run; a damaged file is measured again."""
    import dataclasses

    from dataflow import cachefiles
    from dataflow.plan import retime

    monkeypatch.setenv(cachefiles.ENV_VAR, str(tmp_path))

    prog, _ = _spmm(m=512, k=512, density=0.04)
    mapping, _ = choose_schedule(prog, DEFAULT)
    km, program = mapping.kernels[0], mapping.program
    runs = []
    measure = retime._measure
    monkeypatch.setattr(retime, "_measure", lambda *a: runs.append(1) or measure(*a))
    monkeypatch.setattr(retime, "_SAMPLES", {})
    first = retime.sample_cycles(km, DEFAULT, program)
    assert retime.sample_cycles(km, DEFAULT, program) == first and len(runs) == 1
    name, x = program.inputs[-1]
    changed = dataclasses.replace(program, inputs=(*program.inputs[:-1],
                                                   (name, np.asarray(x) + 1)))
    retime.sample_cycles(km, DEFAULT, changed)
    assert len(runs) == 2
    # a new process: the memory memo empty, the file on disk serves
    monkeypatch.setattr(retime, "_SAMPLES", {})
    assert retime.sample_cycles(km, DEFAULT, program) == first and len(runs) == 2
    files = sorted((tmp_path / "tile_samples").glob("*.sample"))
    assert len(files) >= 2  # the candidates choose_schedule measured, too
    for f in files:
        f.write_bytes(f.read_bytes()[:-3] + b"zzz")  # damaged: checksum fails
    monkeypatch.setattr(retime, "_SAMPLES", {})
    assert retime.sample_cycles(km, DEFAULT, program) == first and len(runs) == 3
