"""The workload table (`dataflow.workloads.WORKLOAD_TABLE`) says what the workload modules
register: the CLI builds its flags from the table and `get` imports a workload's module from it,
so neither has to import every workload (start-up, issue 14)."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from dataflow import workloads as wl
from dataflow.attention.patterns import PATTERNS


def _fresh(code: str) -> str:
    """stdout of `code` run in a new interpreter (nothing imported yet)."""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_every_table_module_registers_what_the_table_says():
    for module in wl.WORKLOAD_MODULES:
        importlib.import_module(module)
    registered = dict(wl._REGISTRY)
    assert set(registered) == set(wl._TABLE), (
        "workloads registered outside WORKLOAD_TABLE, or table entries nobody registers")
    for info in wl.WORKLOAD_TABLE:
        w = registered[info.name]
        assert (w.name, w.help, w.params) == (info.name, info.help, info.params), info.name
    assert list(wl.workloads()) == [i.name for i in wl.WORKLOAD_TABLE]


@pytest.mark.parametrize("module", wl.WORKLOAD_MODULES)
def test_each_module_registers_its_own_workloads(module):
    """`get(name)` imports the table's module and no other, so that module must be the one
    that registers the workload (not one that happens to be imported along with it)."""
    mine = sorted(i.name for i in wl.WORKLOAD_TABLE if i.module == module)
    got = _fresh(f"import importlib; from dataflow import workloads as wl; "
                 f"importlib.import_module({module!r}); print(sorted(wl._REGISTRY))")
    assert set(mine) <= set(eval(got)), f"{module} registers {got}, the table says {mine}"


def test_listing_workloads_and_their_params_imports_no_workload_module():
    got = _fresh("import sys; from dataflow import workloads as wl; wl.all_params(); "
                 "[wl.workload_params(n) for n in wl.workload_names()]; "
                 "print(sorted(m for m in wl.WORKLOAD_MODULES if m in sys.modules))")
    assert got == "[]"


def test_get_imports_only_the_workloads_own_module():
    """(moe builds on dynamic-spmm's and gemm's modules; spmm on none of the others.)"""
    got = _fresh("import sys; from dataflow import workloads as wl; wl.get('spmm'); "
                 "print(sorted(m for m in wl.WORKLOAD_MODULES if m in sys.modules))")
    assert got == "['dataflow.matmul_workloads']"


def test_pattern_choices_are_the_attention_patterns():
    assert wl.all_params()["pattern"].choices == PATTERNS
