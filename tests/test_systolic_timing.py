"""The numpy-free `--timing-only` path of a dense GEMM on a systolic array
(`dataflow/pe_array/systolic_timing.py`, docs/conventions.md#timing-only): the same JSON as the
full timing-only run wherever it answers (stalls of an ofmap SRAM that drains mid-run
included), None (the full path runs) where a read SRAM of SCALE-Sim's memory model refetches;
SCALE-Sim's cycles on the golden GEMMs; a whole `dataflow simulate --timing-only` process that
never imports numpy."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from dataflow.api import simulate
from dataflow.arch import load_arch
from dataflow.cli import main
from dataflow.cli import simulate_command as sc
from dataflow.pe_array.systolic_timing import timing_only_result
from tests.conftest import ARCH_DIR, ROOT

SYSTOLIC = ARCH_DIR / "systolic_32x32.yaml"
BASE = load_arch(SYSTOLIC)
SHAPES = ((1, 1, 1), (64, 64, 64), (100, 33, 7), (40, 24, 72), (64, 64, 65), (300, 129, 17),
          (33, 500, 260))


def _arch(edge: int, words: int | None = None, bytes_per_cycle: float | None = None):
    a = dataclasses.replace(BASE, pe_array=dataclasses.replace(BASE.pe_array, rows=edge,
                                                               cols=edge))
    if words:
        a = dataclasses.replace(a, spm=dataclasses.replace(a.spm, capacity_words_per_line=words))
    if bytes_per_cycle:
        a = dataclasses.replace(a, dram=dataclasses.replace(a.dram,
                                                            bytes_per_cycle=bytes_per_cycle))
    return a


def _json(r) -> str:
    d = r.to_dict()
    d.pop("wall_seconds")
    return json.dumps(d)


# (array edge, SRAM words, DRAM bytes a cycle): the presets' SRAMs, SCALE-Sim-sized ones on
# 128 x 128, and SRAMs small enough that some GEMMs refetch or drain mid-run
ARRAYS = ((8, None, None), (32, None, None), (128, 1 << 24, None), (8, 4096, None),
          (32, 20000, 48.0), (16, 300000, None))


@pytest.mark.parametrize("edge,words,bpc", ARRAYS)
@pytest.mark.parametrize("df", ["os", "ws", "is"])
def test_fast_path_json_is_the_full_runs(edge, words, bpc, df):
    arch = _arch(edge, words, bpc)
    taken = 0
    for m, n, k in SHAPES:
        fast = timing_only_result(arch, m, n, k, df)
        full = simulate("gemm", arch, m=m, n=n, k=k, dataflow=df, timing_only=True)
        if fast is None:  # a read SRAM refetches: the memory model's read buffers
            assert words is not None, "the presets' SRAMs are a closed form"
            continue
        taken += 1
        assert _json(fast) == _json(full)
        assert fast.tile_spans == full.tile_spans and fast.kernels == full.kernels
        assert fast.pe_busy_cycles.tolist() == full.pe_busy_cycles.tolist()
    assert taken == len(SHAPES) if words is None or words > 1 << 20 else taken >= 1


@pytest.mark.parametrize("df", ["ws", "is"])
@pytest.mark.parametrize("shape", [(64, 64, 16), (100, 40, 9), (30, 200, 10)])
def test_fast_path_stalls_as_the_full_run_does(df, shape):
    """An ofmap SRAM that drains mid-run through a one-word DRAM link: writes wait for the
    drains, and the fast path's service of the ofmap SRAM gives the same stalls."""
    arch = _arch(8, 5000, 12.0)
    m, n, k = shape
    fast = timing_only_result(arch, m, n, k, df)
    full = simulate("gemm", arch, m=m, n=n, k=k, dataflow=df, timing_only=True)
    assert fast is not None and fast.stall_cycles_dram > 0
    assert _json(fast) == _json(full)


def test_fast_path_refuses_every_refetching_golden_case():
    """SCALE-Sim's small-SRAM runs (tests/data/scalesim_memory_golden.json) all refetch: the
    fast path leaves every one to the memory model's read buffers."""
    golden = json.loads((ROOT / "tests" / "data" / "scalesim_memory_golden.json").read_text())
    bw = golden["header"]["bandwidth_words_per_cycle"]
    for r in golden["records"]:
        arch = _arch(32, r["sram_words"], 3 * bw * 4)
        assert timing_only_result(arch, r["m"], r["n"], r["k"], r["dataflow"]) is None, r


def test_fast_path_has_scalesims_cycles():
    golden = json.loads((ROOT / "tests" / "data" / "scalesim_golden.json").read_text())
    for r in golden["records"]:
        assert r["rows"] == r["cols"]
        got = timing_only_result(_arch(r["rows"]), r["m"], r["n"], r["k"], r["dataflow"])
        assert got is not None
        assert got.compute_cycles == got.cycles == r["total_cycles"], r
        assert got.stall_cycles_dram == r["stall_cycles"] == 0


@pytest.mark.parametrize("arch,why", [(ARCH_DIR / "default.yaml", "not systolic"),
                                      (_arch(32, 2), "refetches")])
def test_fast_path_declines_what_it_does_not_model(arch, why):
    spec = load_arch(arch) if not hasattr(arch, "pe_array") else arch
    assert timing_only_result(spec, 64, 64, 64, "ws") is None, why


@pytest.mark.parametrize("extra", [["--json"], []])
def test_cli_prints_what_the_full_path_prints(extra, monkeypatch, capsys):
    """The command's output, JSON or summary, with and without the fast path (but the wall
    time)."""
    args = ["simulate", "--arch", str(SYSTOLIC), "--workload", "gemm", "--m", "100", "--k", "70",
            "--n", "45", "--dataflow", "is", "--timing-only", *extra]

    def without_wall(text: str) -> str:
        if extra:
            d = json.loads(text)
            d.pop("wall_seconds")
            return json.dumps(d)
        return "\n".join(ln for ln in text.splitlines() if "wall time" not in ln)

    taken = []
    fast_path = sc.timing_only_fast
    monkeypatch.setattr(sc, "timing_only_fast", lambda *a: taken.append(1) or fast_path(*a))
    assert main(args) == 0
    fast = capsys.readouterr().out
    assert taken
    monkeypatch.setattr(sc, "timing_only_fast", lambda *a: None)
    assert main(args) == 0
    assert without_wall(fast) == without_wall(capsys.readouterr().out)


def test_cli_errors_are_the_full_paths(capsys):
    """Inputs the fast path does not take reach `simulate`, which refuses them as before."""
    base = ["simulate", "--arch", str(SYSTOLIC), "--workload", "gemm", "--timing-only"]
    assert main([*base, "--m", "0"]) == 2
    assert "--m must be a positive integer" in capsys.readouterr().err
    assert main([*base, "--density", "0.5", "--m", "8"]) == 0  # gemm takes --density
    capsys.readouterr()
    assert main(["simulate", "--arch", str(ARCH_DIR / "default.yaml"), "--workload", "gemm",
                 "--timing-only"]) == 2
    assert "systolic" in capsys.readouterr().err


def test_a_timing_only_process_imports_no_numpy(tmp_path):
    """The whole process (`python -m dataflow.cli simulate ... --timing-only`): neither numpy
    nor scipy, networkx or the engine's modules, on the 32 x 32 preset and on a 128 x 128 array
    of SCALE-Sim-sized SRAMs (benchmarks/engine_scalesim.py's two cases)."""
    big = tmp_path / "systolic_128x128.yaml"
    big.write_text(SYSTOLIC.read_text().replace("rows: 32", "rows: 128")
                   .replace("cols: 32", "cols: 128")
                   .replace("capacity_words_per_line: 1572864", "capacity_words_per_line: "
                            f"{1 << 24}"))
    probe = ("import runpy, sys, json, io, contextlib\n"
             "out = io.StringIO()\n"
             "sys.argv = ['dataflow'] + sys.argv[1:]\n"
             "with contextlib.redirect_stdout(out):\n"
             "    try:\n"
             "        runpy.run_module('dataflow.cli', run_name='__main__')\n"
             "    except SystemExit as e:\n"
             "        assert not e.code, e.code\n"
             "print(json.dumps({'result': json.loads(out.getvalue()), 'modules': sorted(m for m "
             "in sys.modules if m.split('.')[0] in ('numpy', 'scipy', 'networkx', 'numba') or "
             "m.startswith(('dataflow.pe_array.simulate', 'dataflow.mapper', 'dataflow.dfg.'"
             ", 'dataflow.api', 'dataflow.pe_array.systolic_memory')))}))")
    for arch, (m, n, k) in ((SYSTOLIC, (256, 256, 256)), (big, (1024, 1024, 1024))):
        run = subprocess.run(
            [sys.executable, "-c", probe, "simulate", "--arch", str(arch), "--workload", "gemm",
             "--m", str(m), "--n", str(n), "--k", str(k), "--dataflow", "ws", "--json",
             "--timing-only"], capture_output=True, text=True, cwd=ROOT)
        assert run.returncode == 0, run.stderr
        got = json.loads(run.stdout.strip().splitlines()[-1])
        assert got["modules"] == ["dataflow.dfg.ops"], got["modules"]  # the op table alone
        assert got["result"]["values_computed"] is False
        full = simulate("gemm", load_arch(arch), m=m, n=n, k=k, dataflow="ws", timing_only=True)
        got["result"].pop("wall_seconds")
        assert json.dumps(got["result"]) == _json(full)


def test_memory_model_on_random_small_srams():
    """`read_once_memory` against `systolic_memory` itself on seeded random GEMMs, arrays,
    SRAM sizes and DRAM links: every figure equal wherever the fast path answers (drains and
    write stalls included)."""
    import random

    import numpy as np

    from dataflow.dfg.lower import lower_gemm
    from dataflow.mapper import map_program
    from dataflow.pe_array.systolic_memory import systolic_memory
    from dataflow.pe_array.systolic_timing import read_once_memory

    rng = random.Random(7)
    taken = stalled = 0
    for _ in range(300):
        edge = rng.choice([2, 4, 8, 16, 32])
        arch = _arch(edge, rng.choice([64, 300, 1000, 5000, 20000]),
                     12.0 * rng.choice([1, 1, 2, 3, 7, 21]))
        m, n, k = (rng.randint(1, 200) for _ in range(3))
        df = rng.choice(["os", "ws", "is"])
        fast = read_once_memory(df, m, n, k, edge, edge, arch)
        if fast is None:
            continue
        program = lower_gemm(np.zeros((m, k), np.float32), np.zeros((k, n), np.float32))
        (sm,) = map_program(program, arch, dataflow=df).kernels
        assert fast == systolic_memory(sm, arch), (edge, arch.spm, m, n, k, df)
        taken += 1
        stalled += fast.stall_cycles > 0
    assert taken >= 40 and stalled >= 5


def test_fast_path_leaves_runs_of_too_many_folds_to_the_full_path():
    from dataflow.pe_array.systolic_timing import MAX_FOLDS

    side = 32 * (int(MAX_FOLDS ** 0.5) + 1)  # more folds than MAX_FOLDS on the 32 x 32 preset
    assert timing_only_result(BASE, side, side, 8, "os") is None
    assert timing_only_result(BASE, side, side // 4, 8, "os") is not None
