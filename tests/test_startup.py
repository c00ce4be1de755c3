"""Start-up (issue 14 point 1): what a command imports before it does anything.

`dataflow --help` and `import dataflow.cli` import none of the heavy libraries, the default job
(`dataflow simulate --workload spmm`) imports only its own workload, and the pieces that keep it
so (the command table, the numpy path of the systolic engine, the networkx-free kernel check)
behave as what they replace. `benchmarks/bench_startup.py` measures the times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys

import numpy as np
import pytest

from dataflow.cli import COMMANDS, _parser
from dataflow.dfg.graph import _has_cycle
from dataflow.pe_array import systolic
from dataflow.workloads import WORKLOAD_MODULES
from tests.conftest import ARCH_DIR

HEAVY = ("scipy", "networkx", "matplotlib", "numba", "torch")


def _imported_by(code: str) -> set[str]:
    """The top-level packages and dataflow modules in sys.modules after `code` runs in a new
    interpreter."""
    probe = (f"import sys, json\n{code}\n"
             "print(json.dumps(sorted({m if m.startswith('dataflow') else m.split('.')[0] "
             "for m in sys.modules})))")
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout.strip().splitlines()[-1]))


def test_importing_the_cli_imports_no_heavy_library():
    got = _imported_by("import dataflow.cli")
    assert not got & set(HEAVY), f"import dataflow.cli imports {sorted(got & set(HEAVY))}"


def test_help_imports_no_heavy_library_and_no_command():
    got = _imported_by("from dataflow.cli import main\ntry:\n    main(['--help'])\n"
                       "except SystemExit:\n    pass")
    assert not got & {*HEAVY, "numpy", "yaml"}
    assert {m for m in got if m.startswith("dataflow")} == {"dataflow", "dataflow.cli",
                                                            "dataflow.errors"}


def test_import_dataflow_imports_nothing_else():
    got = _imported_by("import dataflow")
    assert not got & {*HEAVY, "numpy"}
    assert {m for m in got if m.startswith("dataflow")} == {"dataflow"}


def test_the_default_job_imports_only_its_own_workload():
    arch = ARCH_DIR / "default.yaml"
    got = _imported_by("from dataflow.cli import main\n"
                       f"assert main(['simulate', '--arch', {str(arch)!r}, '--workload', 'spmm',"
                       " '--m', '32', '--k', '32', '--n', '8']) == 0")
    assert not got & {"matplotlib", "numba", "torch"}
    others = set(WORKLOAD_MODULES) - {"dataflow.matmul_workloads"}
    assert not got & others
    assert not {m for m in got if m.startswith(("dataflow.models", "dataflow.cuda",
                                                "dataflow.dse", "dataflow.report"))}


def test_every_command_is_listed_and_its_module_adds_it():
    assert list(_parser([])._subparsers._group_actions[0].choices) == list(COMMANDS)
    for module in dict.fromkeys(c.module for c in COMMANDS.values()):
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).add_parser(sub)
        assert list(sub.choices) == [n for n, c in COMMANDS.items() if c.module == module]
        for name, p in sub.choices.items():
            assert p.get_default("func") is not None, name
    for name in COMMANDS:  # the chosen command has its arguments, the others only their line
        chosen = _parser([name])._subparsers._group_actions[0].choices[name]
        assert chosen.get_default("func") is not None


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 7), (17, 64, 9), (64, 1, 33), (8, 0, 4)])
def test_systolic_numpy_and_numba_products_are_the_same_bits(shape):
    m, k, n = shape
    rng = np.random.default_rng(m * 100 + k)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    start = rng.standard_normal((m, n), dtype=np.float32)  # later k-folds start from a sum
    by_numpy, by_numba = start.copy(), start.copy()
    systolic._matmul_k_ordered(a, b, by_numpy)  # under NUMPY_MAX_MACS: numpy
    systolic._compiled_k_ordered()(a, b, by_numba)
    assert np.array_equal(by_numpy, by_numba)


def test_large_systolic_products_run_in_numba(monkeypatch):
    calls = []
    monkeypatch.setattr(systolic, "_compiled_k_ordered", lambda: lambda *a: calls.append(a))
    a, b, out = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), np.zeros((4, 4))
    systolic._matmul_k_ordered(a, b, out)
    assert not calls  # 64 MACs: numpy
    monkeypatch.setattr(systolic, "NUMPY_MAX_MACS", 63)
    systolic._matmul_k_ordered(a, b, out)
    assert len(calls) == 1


@pytest.mark.parametrize(("edges", "cycle"), [
    (set(), False), ({(0, 1), (1, 2), (0, 2)}, False), ({(0, 0)}, True),
    ({(0, 1), (1, 2), (2, 0)}, True), ({(0, 1), (2, 3), (3, 2)}, True)])
def test_kernel_check_finds_distance_zero_cycles(edges, cycle):
    assert _has_cycle(edges) is cycle
