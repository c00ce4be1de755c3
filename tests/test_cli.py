import json
import subprocess
import sys

import pytest

from dataflow.arch import ArchError
from dataflow.cli import main, simulate_command
from dataflow.dfg import DFGError
from dataflow.errors import UserError
from dataflow.mapper import MappingError
from dataflow.ust_frontend import FormatError
from tests.conftest import ARCH_DIR

KEYS = {"cycles", "compute_cycles", "stall_cycles", "pe_utilization", "spm_reads", "spm_writes",
        "spm_conflict_cycles", "dram_bytes", "values_match_reference", "wall_seconds"}


def test_simulate_json_spmm(capsys):
    rc = main(["simulate", "--workload", "spmm", "--m", "64", "--k", "64", "--n", "16",
               "--density", "0.1", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert KEYS <= set(out)
    assert set(out["stall_cycles"]) >= {"spm_conflict", "dram_bandwidth", "reconfiguration"}
    assert out["values_match_reference"] is True
    assert out["cycles"] >= out["compute_cycles"] > 0


@pytest.mark.parametrize("df", ["os", "ws", "is"])
def test_simulate_systolic_gemm(capsys, df):
    rc = main(["simulate", "--arch", str(ARCH_DIR / "systolic_32x32.yaml"), "--workload", "gemm",
               "--m", "64", "--k", "64", "--n", "64", "--dataflow", df, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    # SCALE-Sim 3.0.0, 64x64x64 on 32x32: os 503, ws/is 631 (tests/data/scalesim_golden.json)
    assert out["compute_cycles"] == {"os": 503, "ws": 631, "is": 631}[df]


def test_readable_summary(capsys):
    assert main(["simulate", "--m", "32", "--k", "32", "--n", "8"]) == 0
    text = capsys.readouterr().out
    for word in ("cycles", "PE utilisation", "stall cycles", "SPM", "DRAM", "match the numpy"):
        assert word in text


def test_bad_arch_is_one_clear_error(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((ARCH_DIR / "default.yaml").read_text().replace("lines: 16", "linez: 16"))
    assert main(["simulate", "--arch", str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "spm.linez" in err and "Traceback" not in err


def test_bad_sizes_are_clear(capsys):
    assert main(["simulate", "--m", "0"]) == 2
    assert "--m must be a positive integer" in capsys.readouterr().err


def test_console_script_runs():
    out = subprocess.run([sys.executable, "-m", "dataflow.cli", "simulate",
                          "--m", "16", "--k", "16", "--n", "8", "--json"],
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["values_match_reference"] is True


def test_workload_that_does_not_fit_the_spm(tmp_path, capsys):
    # 128 words: too few even for the smallest block of a split
    # (docs/conventions.md#tiling-any-problem-size); 1,024 words would run it in 128 blocks
    small = tmp_path / "small.yaml"
    small.write_text((ARCH_DIR / "default.yaml").read_text()
                     .replace("capacity_words_per_line: 65536", "capacity_words_per_line: 8"))
    assert main(["simulate", "--arch", str(small), "--m", "64", "--k", "512", "--n", "64"]) == 2
    err = capsys.readouterr().err
    assert "does not fit the SPM" in err and str(small) in err


def test_bad_input_is_one_line_and_exit_2(capsys):
    assert main(["simulate", "--workload", "gemm", "--m", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dataflow: error: ") and err.count("\n") == 1
    assert "--m" in err and "Traceback" not in err


def test_internal_error_keeps_its_traceback_and_asks_for_a_report(monkeypatch, capsys):
    def broken(*args, **kwargs):  # a bug deep inside: not the user's fault
        raise ValueError("index 7 out of bounds in the scheduler")

    monkeypatch.setattr(simulate_command, "simulate", broken)
    assert main(["simulate", "--workload", "gemm", "--m", "8", "--k", "8", "--n", "8"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert "internal error" in err and "report it" in err
    assert "dataflow simulate --workload gemm" in err


def test_user_errors_share_one_base():
    for cls in (ArchError, DFGError, MappingError, FormatError):
        assert issubclass(cls, UserError)
    assert not issubclass(KeyError, UserError)


@pytest.mark.parametrize("terminal", [True, False])
def test_a_model_shows_its_layers_done_on_a_terminal(tmp_path, capsys, monkeypatch, terminal):
    """Long runs show progress on a terminal (issue 14): a model's layers as a tqdm bar on
    stderr when stderr is a terminal, nothing when it is a file."""
    topo = tmp_path / "two.csv"
    topo.write_text("Layer, M, N, K,\nfirst, 8, 8, 8,\nsecond, 8, 16, 8,\n")
    monkeypatch.setattr(sys.stderr, "isatty", lambda: terminal)
    rc = main(["simulate", "--arch", str(ARCH_DIR / "systolic_32x32.yaml"), "--topology",
               str(topo), "--json"])
    assert rc == 0
    err = capsys.readouterr().err
    assert ("/2 [" in err and "layer" in err) is terminal
