"""benchmarks/bench_roofline.py cannot rot: its row function runs a tiny case, a refused case
and the SDDMM runner, and the table it writes reads them (a few seconds; the benchmark's own
sizes take minutes)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    path = ROOT / "benchmarks" / "bench_roofline.py"
    spec = importlib.util.spec_from_file_location("bench_roofline", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules[spec.name]


def test_a_tiny_row(bench):
    case = bench.Case("CSR SpMM", "spmm", {"m": 64, "k": 64, "n": 8, "density": 0.1},
                      target=0.6, target_mlx=0.9)
    row = bench.run_case(case, "default", bench.PRESETS["default"])
    assert row["refused"] is None and row["values_ok"] is True
    assert row["workload"] == "CSR SpMM (m 64, k 64, n 8, density 0.1)"
    assert row["target"] == 0.6  # target_mlx is the MLX preset's only
    assert row["bound"] in ("compute", "dram", "spm_ports")
    assert 0 < row["fraction_of_roofline"] <= 1
    assert row["roofline_cycles"] <= row["cycles"]
    assert row["met"] == (row["fraction_of_roofline"] >= 0.6)
    assert bool(row["binds"]) != row["met"]  # a missed target names what binds
    if row["binds"]:
        assert row["binds"].endswith(("of cycles", "MACs/cycle)"))
    assert str(row["cycles"]) in bench.row_text(row).replace(",", "")
    json.dumps(row)  # the .json output takes every row as it is


def test_a_refused_row_and_the_table(bench):
    bad = bench.Case("CSR SpMM", "spmm", {"m": 64, "k": 64, "n": 8, "density": 2.0})
    refused = bench.run_case(bad, "mlx_4x4", bench.PRESETS["mlx_4x4"])
    assert refused["cycles"] is None and "density" in refused["refused"]
    assert "\n" not in refused["refused"]
    sddmm = bench.Case("SDDMM", "sddmm", {"m": 32, "n": 32, "k": 8, "density": 0.2})
    row = bench.run_case(sddmm, "default", bench.PRESETS["default"])
    assert row["refused"] is None and row["values_ok"] is True and row["cycles"] > 0
    table = bench.markdown([row, refused], "header").splitlines()
    assert table[0] == "header" and table[-1] == bench.FOOTER and len(table) == 8
    assert "refused: " in table[5] and "| ok |" in table[4]


def test_every_case_labels_its_sizes(bench):
    labels = [c.label() for c in bench.CASES]
    assert len(set(labels)) == len(labels)
    assert "GEMM (m 512, k 512, n 512)" in labels
    assert all(c.label(quick=True) for c in bench.CASES if c.quick is not None)
