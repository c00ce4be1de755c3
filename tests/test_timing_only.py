"""`--timing-only` (issue 14 point 3): a dense GEMM on a systolic array, whose timing does not
depend on its values, simulated as SCALE-Sim runs it -- cycles, stalls, traffic and energy the
same as a run with values, no values drawn or computed, and the result says so."""

from __future__ import annotations

import json

import pytest

from dataflow.api import simulate
from dataflow.cli import main
from dataflow.errors import UserError
from tests.conftest import ARCH_DIR

SYSTOLIC = ARCH_DIR / "systolic_32x32.yaml"
TIMING = ("cycles", "compute_cycles", "stall_cycles", "macs", "spm_reads", "spm_writes",
          "spm_reads_per_line", "spm_writes_per_line", "dram_bytes_read", "dram_bytes_written",
          "energy_pj", "kernels", "roofline_cycles", "bound", "fraction_of_roofline", "notes")


@pytest.mark.parametrize("df,shape", [("os", (40, 24, 72)), ("ws", (100, 33, 7)),
                                      ("is", (64, 64, 65))])
def test_timing_only_has_the_full_runs_timing(df, shape):
    m, k, n = shape
    full = simulate("gemm", SYSTOLIC, m=m, k=k, n=n, dataflow=df).to_dict()
    fast = simulate("gemm", SYSTOLIC, m=m, k=k, n=n, dataflow=df, timing_only=True)
    assert full["values_computed"] and full["values_match_reference"]
    assert not fast.values_computed and fast.output is None
    assert fast.values_match_reference is None and fast.max_abs_error is None
    got = fast.to_dict()
    assert {key: got[key] for key in TIMING} == {key: full[key] for key in TIMING}


def test_timing_only_on_the_command_line(capsys):
    args = ["simulate", "--arch", str(SYSTOLIC), "--workload", "gemm", "--m", "64", "--k", "32",
            "--n", "16", "--dataflow", "ws", "--timing-only"]
    assert main(args) == 0  # values not computed is not a mismatch
    assert "values           not computed (--timing-only" in capsys.readouterr().out
    assert main([*args, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["values_computed"] is False and got["values_match_reference"] is None
    assert got["cycles"] > 0


def test_timing_only_neither_draws_nor_multiplies(monkeypatch):
    """No operand is drawn and no product computed: both raise here, and the run still times."""
    from dataflow import matmul_workloads
    from dataflow.pe_array import systolic

    def refuse(*args, **kwargs):
        raise AssertionError("a timing-only run touched the values")

    monkeypatch.setattr(matmul_workloads, "draw_operands", refuse)
    monkeypatch.setattr(systolic, "_matmul_k_ordered", refuse)
    r = simulate("gemm", SYSTOLIC, m=96, k=80, n=64, dataflow="os", timing_only=True)
    assert r.macs == 96 * 80 * 64 and r.cycles > r.macs // (32 * 32)
    with pytest.raises(AssertionError, match="touched the values"):
        simulate("gemm", SYSTOLIC, m=96, k=80, n=64, dataflow="os")


@pytest.mark.parametrize("workload,arch,why", [
    ("gemm", ARCH_DIR / "default.yaml", "systolic"),
    ("spmm", SYSTOLIC, "--timing-only applies to gemm"),
])
def test_timing_only_is_refused_where_timing_follows_values(workload, arch, why):
    with pytest.raises(UserError, match=why):
        simulate(workload, arch, m=16, k=16, n=8, timing_only=True)
