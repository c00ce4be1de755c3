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
from dataflow.matmul_split import random_csr
from dataflow.matmul_workloads import make_operands
from dataflow.pe_array import systolic
from dataflow.ust_frontend import reference
from dataflow.ust_frontend.named import NamedFormats
from dataflow.ust_frontend.tensor import Tensor
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
    assert {m for m in got if m.startswith("dataflow")} == {
        "dataflow", "dataflow.lazy_exports", "dataflow.cli", "dataflow.errors"}


def test_import_dataflow_imports_nothing_else():
    got = _imported_by("import dataflow")
    assert not got & {*HEAVY, "numpy"}
    # the package and the leaf that makes its names lazy (dataflow/lazy_exports.py)
    assert {m for m in got if m.startswith("dataflow")} == {"dataflow", "dataflow.lazy_exports"}


def test_the_default_job_imports_only_its_own_workload():
    """No scipy (the CSR operand and its reference are numpy's), no plotting or compiling; with
    the plan cache warm (the second run) not networkx either, which only the mapper's and the
    compiler's searches use."""
    arch = ARCH_DIR / "default.yaml"
    job = ("from dataflow.cli import main\n"
           f"assert main(['simulate', '--arch', {str(arch)!r}, '--workload', 'spmm',"
           " '--m', '32', '--k', '32', '--n', '8']) == 0")
    for run in ("cold", "warm"):  # the first run fills the on-disk plan cache
        got = _imported_by(job)
        assert not got & {"matplotlib", "numba", "torch", "scipy"}, run
    assert "networkx" not in got
    others = set(WORKLOAD_MODULES) - {"dataflow.matmul_workloads"}
    assert not got & others
    assert not {m for m in got if m.startswith(("dataflow.models", "dataflow.cuda",
                                                "dataflow.dse", "dataflow.report"))}


def test_a_systolic_job_imports_neither_simpy_nor_the_stepper():
    """The systolic path (SCALE-Sim's comparisons) imports its own engine and memory model, not
    the CGRA system model (SimPy), the per-cycle stepper, scipy or networkx."""
    arch = ARCH_DIR / "systolic_32x32.yaml"
    got = _imported_by("from dataflow.cli import main\n"
                       f"assert main(['simulate', '--arch', {str(arch)!r}, '--workload', 'gemm',"
                       " '--m', '40', '--k', '24', '--n', '8', '--dataflow', 'ws']) == 0")
    assert not got & {"simpy", "scipy", "networkx", "numba", "matplotlib"}
    assert {"dataflow.pe_array.systolic", "dataflow.pe_array.systolic_memory"} <= got
    assert not got & {"dataflow.pe_array.reference", "dataflow.pe_array.system"}
    # timing only (SCALE-Sim's mode), nor the UST frontend, the schedule search or the split,
    # which only a reconfigurable array's run uses (a systolic GEMM is mapped as lowered)
    got = _imported_by("from dataflow.cli import main\n"
                       f"assert main(['simulate', '--arch', {str(arch)!r}, '--workload', 'gemm',"
                       " '--m', '40', '--k', '24', '--n', '8', '--timing-only']) == 0")
    assert not got & {"simpy", "scipy", "networkx", "numba", "matplotlib"}
    assert not {m for m in got if m.startswith(("dataflow.ust_frontend", "dataflow.plan"))}
    assert "dataflow.matmul_split" not in got


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
    systolic._numpy_k_ordered(a, b, by_numpy)
    systolic._compiled_k_ordered()(a, b, by_numba)
    assert np.array_equal(by_numpy, by_numba)


def test_large_systolic_products_run_in_numba(monkeypatch):
    """numpy until the time it took (or would take) exceeds numba's start-up; numba for every
    product above NUMPY_MAX_MACS once loaded (here, or by another engine: numba imported)."""
    import sys

    calls = []
    monkeypatch.setattr(systolic, "_compiled_k_ordered", lambda: lambda *a: calls.append(a))
    monkeypatch.setattr(systolic, "_SPENT", {"numpy_s": 0.0, "numba": False})
    numba = sys.modules.get("numba")
    monkeypatch.delitem(sys.modules, "numba", raising=False)  # as in a process without it
    a, b, out = np.ones((4, 4), np.float32), np.ones((4, 4), np.float32), np.zeros((4, 4))
    systolic._matmul_k_ordered(a, b, out)
    assert not calls and systolic._SPENT["numpy_s"] > 0  # 64 MACs: numpy, its time counted
    assert not systolic._use_numba(256 ** 3) and systolic._use_numba(1024 ** 3)
    systolic._SPENT["numpy_s"] = systolic.NUMBA_STARTUP_S  # the rent paid reaches the price
    systolic._matmul_k_ordered(a, b, out)
    assert len(calls) == 1 and systolic._SPENT["numba"]
    assert systolic._use_numba(systolic.NUMPY_MAX_MACS + 1)
    assert not systolic._use_numba(systolic.NUMPY_MAX_MACS)
    systolic._SPENT.update(numpy_s=0.0, numba=False)
    monkeypatch.setitem(sys.modules, "numba", numba or object())  # loaded by the fast engine
    assert systolic._use_numba(systolic.NUMPY_MAX_MACS + 1)


@pytest.mark.parametrize(("edges", "cycle"), [
    (set(), False), ({(0, 1), (1, 2), (0, 2)}, False), ({(0, 0)}, True),
    ({(0, 1), (1, 2), (2, 0)}, True), ({(0, 1), (2, 3), (3, 2)}, True)])
def test_kernel_check_finds_distance_zero_cycles(edges, cycle):
    assert _has_cycle(edges) is cycle


@pytest.mark.parametrize(("rows", "cols", "density", "seed"),
                         [(256, 256, 0.05, 0), (1, 1, 1.0, 3), (7, 300, 0.5, 1), (300, 7, 0.01, 2),
                          (50, 60, 0.0, 4)])
def test_numpy_csr_draws_are_scipys(rows, cols, density, seed):
    """`random_csr` (the default job's A, drawn without scipy) is the matrix scipy.sparse.random
    drew from the same generator state, and leaves the generator where scipy left it."""
    sp = pytest.importorskip("scipy.sparse")
    ours, theirs = np.random.default_rng(seed), np.random.default_rng(seed)
    indptr, indices, data = random_csr(rows, cols, density, ours)
    a = sp.random(rows, cols, density=density, format="csr", dtype=np.float32,
                  random_state=theirs,
                  data_rvs=lambda size: theirs.standard_normal(size).astype(np.float32))
    a.sort_indices()
    for got, want in ((indptr, a.indptr), (indices, a.indices), (data, a.data)):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert ours.random() == theirs.random()
    op, _ = make_operands("spmm", rows, cols, 4, max(density, 1e-9), seed)
    assert isinstance(op, sp.csr_matrix)


@pytest.mark.parametrize(("rows", "cols", "n", "density"),
                         [(40, 30, 5, 0.3), (64, 64, 8, 1.0), (9, 50, 3, 0.02), (5, 5, 2, 0.0)])
def test_numpy_spmm_reference_is_scipys_bits(rows, cols, n, density, monkeypatch):
    """Under NUMPY_MAX_PRODUCTS the sparse @ dense reference adds in numpy what scipy's CSR
    kernel adds, in the same order: the same float64 bits, stored zeros and infs included."""
    sp = pytest.importorskip("scipy.sparse")
    rng = np.random.default_rng(rows)
    indptr, indices, data = random_csr(rows, cols, density, rng)
    if len(data):
        data[0], data[-1] = 0.0, np.inf  # a stored zero and an inf take part as stored
    a = Tensor(NamedFormats.CSR, (rows, cols), (None, indptr), (None, indices), data)
    b = rng.standard_normal((cols, n))
    by_numpy = reference._stored_times_dense(a, b)
    by_scipy = sp.csr_matrix((data.astype(np.float64), indices, indptr), shape=(rows, cols)) @ b
    assert np.array_equal(by_numpy, by_scipy, equal_nan=True)
    monkeypatch.setattr(reference, "NUMPY_MAX_PRODUCTS", 0)  # the scipy side of the threshold
    assert np.array_equal(reference._stored_times_dense(a, b), by_scipy, equal_nan=True)
