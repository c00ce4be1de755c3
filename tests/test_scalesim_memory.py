"""SCALE-Sim 3.0.0's USER-bandwidth memory model on the systolic path
(`dataflow/pe_array/systolic_memory.py`) against SCALE-Sim itself, on GEMMs whose SRAMs are
small enough that every buffer refetches: the read buffers' prefetch windows shift many times,
the ofmap buffer drains while it fills. Golden: tests/data/scalesim_memory_golden.json
(benchmarks/scalesim/regen_memory_golden.py); SCALE-Sim is not needed here.
"""

import dataclasses
import json

import numpy as np
import pytest

from dataflow.arch import load_arch
from dataflow.errors import UserError
from dataflow.mapper import map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.pe_array.systolic_memory import link_words_per_cycle, systolic_memory
from dataflow.ust_frontend.ops import as_tensor, lower_matmul
from tests.conftest import ROOT

GOLDEN = json.loads((ROOT / "tests" / "data" / "scalesim_memory_golden.json").read_text())
SYSTOLIC = load_arch(ROOT / "arch_configs" / "systolic_32x32.yaml")
BW = GOLDEN["header"]["bandwidth_words_per_cycle"]


def _arch(sram_words, bw=BW):
    return dataclasses.replace(
        SYSTOLIC, dram=dataclasses.replace(SYSTOLIC.dram, bytes_per_cycle=3 * bw * 4),
        spm=dataclasses.replace(SYSTOLIC.spm, capacity_words_per_line=sram_words))


def _mapping(m, n, k, df, arch):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    return map_program(lower_matmul(as_tensor(a), as_tensor(b)), arch, dataflow=df)


def _rid(r):
    return f"{r['dataflow']}-{r['m']}x{r['n']}x{r['k']}-{r['sram_words']}w"


@pytest.mark.parametrize("rec", GOLDEN["records"], ids=_rid)
def test_memory_model_equals_scalesim(rec):
    arch = _arch(rec["sram_words"])
    (sm,) = _mapping(rec["m"], rec["n"], rec["k"], rec["dataflow"], arch).kernels
    mem = systolic_memory(sm, arch)
    assert rec["stall_cycles"] > 0
    assert (mem.total_cycles, mem.total_cycles_incl_prefetch, mem.stall_cycles) == \
        (rec["total_cycles"], rec["total_cycles_incl_prefetch"], rec["stall_cycles"])


def test_result_carries_totals_stalls_and_traffic():
    rec = GOLDEN["records"][0]
    arch = _arch(rec["sram_words"])
    mapping = _mapping(rec["m"], rec["n"], rec["k"], rec["dataflow"], arch)
    res = simulate_mapping(mapping)
    assert res.cycles == rec["total_cycles"]
    assert res.stall_cycles_dram == rec["stall_cycles"]
    assert res.cycles == res.compute_cycles + res.stall_cycles_dram
    (note,) = res.notes
    assert f"Total Cycles (incl. prefetch) {rec['total_cycles_incl_prefetch']}" in note
    # refetching: more DRAM reads than the operands once
    assert res.dram_bytes_read > (rec["m"] + rec["n"]) * rec["k"] * arch.word_bytes


def test_operands_that_fit_are_fetched_once_and_never_stall():
    arch = _arch(1 << 20)
    m, n, k = 64, 96, 80
    for df in ("os", "ws", "is"):
        res = simulate_mapping(_mapping(m, n, k, df, arch))
        assert res.stall_cycles_dram == 0 and res.cycles == res.compute_cycles
        # one whole-line prefetch of each operand (padded folds included); the ofmap once per
        # fold that writes it (ws / is write partial sums once per k-fold, as SCALE-Sim does)
        k_folds = 1 if df == "os" else -(-k // arch.pe_array.rows)
        assert res.dram_bytes_written == m * n * k_folds * arch.word_bytes
        assert res.dram_bytes_read >= (m + n) * k * arch.word_bytes


def test_bandwidth_below_a_word_per_link_is_refused():
    arch = dataclasses.replace(SYSTOLIC, dram=dataclasses.replace(SYSTOLIC.dram,
                                                                  bytes_per_cycle=8.0))
    with pytest.raises(UserError, match="less than one word a cycle"):
        link_words_per_cycle(arch)


SHORTCUT_CASES = [  # (m, n, k, dataflow, rows, cols, SRAM words, link words a cycle)
    (40, 33, 27, "os", 8, 6, 64, 3), (40, 33, 27, "ws", 8, 6, 300, 2),
    (17, 50, 45, "is", 5, 7, 128, 5), (64, 64, 64, "ws", 16, 16, 1 << 20, 4),
    (30, 20, 70, "os", 4, 4, 2000, 1), (70, 9, 33, "ws", 6, 3, 50, 7),
    (25, 25, 25, "is", 5, 5, 700, 3)]


@pytest.mark.parametrize("case", SHORTCUT_CASES, ids=str)
def test_shortcuts_give_the_per_line_figures(case, monkeypatch):
    """The closed-form write counts are the ofmap demand's, the fold-by-fold read demand is the
    per-word one, and storing the quiet lines at once gives what servicing every line gives
    (stalling and non-stalling SRAMs, each dataflow, a convolution's repeated ifmap
    addresses)."""
    from dataflow.pe_array import systolic_demand
    from dataflow.pe_array import systolic_memory as mem

    m, n, k, df, rows, cols, words, bw = case
    arch = dataclasses.replace(
        _arch(words, bw), pe_array=dataclasses.replace(SYSTOLIC.pe_array, rows=rows, cols=cols))
    (sm,) = _mapping(m, n, k, df, arch).kernels
    (_, _, (of_lines, _)), lines = systolic_demand.demand(sm)
    assert np.array_equal(systolic_demand.write_counts(sm), np.bincount(of_lines, minlength=lines))
    addresses = np.random.default_rng(k).integers(-1, m * k // 3, (m, k)) if df == "ws" else None
    words, _ = systolic_demand.demand(sm, addresses)
    for operand in (0, 1):  # fold by fold, the same words in the same order
        chunks = list(systolic_demand.read_demand(sm, operand, addresses))
        for got, want in zip(map(np.concatenate, zip(*chunks)), words[operand]):
            assert np.array_equal(got, want)
    fast = mem.systolic_memory(sm, arch, addresses)
    monkeypatch.setattr(mem, "_quiet_lines", lambda *a: 0)  # service every line
    assert mem.systolic_memory(sm, arch, addresses) == fast
