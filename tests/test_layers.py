"""The import structure of the package (docs/architecture.md#layers).

Modules import only from their own layer or a lower one, at module top, and the module graph
has no cycle. Declared leaf modules import nothing from `dataflow`, so every layer may use them.
A function-level import of a `dataflow` module is allowed only where `DEFERRED` names it with
the reason (the CUDA kernel modules, whose import must wait until the device mode is fixed).
The on-disk caches' fingerprint covers every module their cached decisions import.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

from dataflow import cachefiles

PACKAGE = Path(cachefiles.__file__).resolve().parent

LEAVES = ("dataflow.errors", "dataflow.testing", "dataflow.cachefiles", "dataflow.dfg.ops",
          "dataflow.lazy_exports")
#: (layer number, module prefixes); a module belongs to the longest prefix that matches
LAYERS = (
    (1, ("dataflow.arch",)),
    (2, ("dataflow.dfg",)),
    (3, ("dataflow.mapper",)),
    (4, ("dataflow.pe_array", "dataflow.spm")),
    (5, ("dataflow.plan",)),
    (6, ("dataflow.ust_frontend",)),
    (7, ("dataflow.workloads", "dataflow.matmul_workloads", "dataflow.matmul_split",
         "dataflow.butterfly",
         "dataflow.attention", "dataflow.dynamic", "dataflow.moe")),
    (8, ("dataflow.api", "dataflow.models")),
    (9, ("dataflow.cli", "dataflow.report", "dataflow.dse", "dataflow.cuda")),
    (10, ("dataflow",)),
)
#: function-level imports of dataflow modules that are deferred on purpose: (module, imported)
DEFERRED = {
    # numba.cuda reads its configuration (simulator or GPU) when first imported; the kernel
    # modules import it, so they are imported after `device.cuda_module()` has decided
    ("dataflow.cuda.ops", "dataflow.cuda.kernels"),
    ("dataflow.cuda.registry", "dataflow.cuda.kernels"),
    # start-up (issue 14): each engine and system model is imported where a run needs it, so a
    # systolic run imports neither the stepper nor SimPy, a fast CGRA run no systolic module
    ("dataflow.pe_array.simulate", "dataflow.pe_array.reference"),
    ("dataflow.pe_array.simulate", "dataflow.pe_array.system"),
    ("dataflow.pe_array.simulate", "dataflow.pe_array.systolic"),
    ("dataflow.pe_array.simulate", "dataflow.pe_array.systolic_memory"),
    # a systolic GEMM (SCALE-Sim's comparisons, `--timing-only`) is lowered and mapped as it
    # is: the frontend, the schedule search, the split and the modulo scheduler are imported
    # where a reconfigurable array's run (or a split one) uses them
    *(("dataflow.matmul_workloads", m) for m in (
        "dataflow.matmul_split", "dataflow.ust_frontend.named", "dataflow.ust_frontend.op_base",
        "dataflow.ust_frontend.tensor", "dataflow.ust_frontend.reference",
        "dataflow.plan.compile", "dataflow.pe_array.simulate", "dataflow.dfg.lower",
        "dataflow.mapper.map")),
    # numpy-free start-up of `simulate --timing-only` (docs/conventions.md#timing-only): the
    # value checks (numpy) where a run is finished, the program's buffers (dfg.graph, numpy)
    # where a roofline reads them, so listing workloads and `roofline.floors` import no numpy
    ("dataflow.workloads", "dataflow.testing"),
    ("dataflow.pe_array.roofline", "dataflow.dfg.graph"),
}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _target(node: ast.ImportFrom | ast.Import, here: str, is_pkg: bool, known) -> list[str]:
    """The dataflow modules an import statement loads (a `from pkg import sub` names the
    submodule when `sub` is one, else the package)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "dataflow"]
    if node.level:
        base = here.split(".") if is_pkg else here.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    if mod.split(".")[0] != "dataflow":
        return []
    subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
    return subs if len(subs) == len(node.names) else [mod, *subs]


def import_edges():
    """(importer, imported, line, at module top?) for every dataflow import in the package."""
    known = modules()
    out = []
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        top |= {id(s) for n in tree.body if isinstance(n, ast.If) for s in n.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for t in _target(node, name, path.name == "__init__.py", known):
                    out.append((name, t, node.lineno, id(node) in top))
    return out


def layer(mod: str) -> int:
    if mod in LEAVES:
        return 0
    best = max((p for _, ps in LAYERS for p in ps if mod == p or mod.startswith(p + ".")), key=len)
    return next(n for n, ps in LAYERS if best in ps)


def test_every_module_has_a_layer():
    for mod in modules():
        assert layer(mod) >= 0


def test_leaves_import_nothing_from_dataflow():
    bad = [(a, b, ln) for a, b, ln, _ in import_edges() if a in LEAVES and b != a]
    assert not bad, f"leaf modules import dataflow modules: {bad}"


def test_imports_point_down_the_layers():
    bad = [f"{a}:{ln} imports {b} (layer {layer(a)} -> {layer(b)})"
           for a, b, ln, _ in import_edges() if layer(b) > layer(a)]
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_imports_sit_at_module_top():
    bad = [f"{a}:{ln} imports {b} inside a function"
           for a, b, ln, top in import_edges()
           if not top and not any(a == m and (b == t or b.startswith(t + "."))
                                  for m, t in DEFERRED)]
    assert not bad, "function-level imports of dataflow modules:\n" + "\n".join(bad)


def test_module_graph_has_no_cycle():
    g = nx.DiGraph((a, b) for a, b, _, _ in import_edges() if a != b)
    # a package's __init__ importing its own submodules and a submodule importing the package
    # name is the one shape Python resolves by order; anything else is a real cycle
    cycles = [c for c in nx.simple_cycles(g) if len(c) > 1][:10]
    assert not cycles, f"import cycles: {cycles}"


@pytest.mark.parametrize("cached", ["dataflow.ust_frontend.plan", "dataflow.plan.spm_layout",
                                    "dataflow.plan.orchestrate", "dataflow.mapper"])
def test_cache_fingerprint_covers_what_cached_decisions_import(cached):
    g = nx.DiGraph((a, b) for a, b, _, _ in import_edges())
    deps = {cached} | nx.descendants(g, cached)
    hashed = {module_name(p) for p in cachefiles.fingerprint_files()}
    missing = sorted(d for d in deps if d not in hashed and modules()[d].name != "__init__.py"
                     or d in ("dataflow",))
    assert not missing, f"{cached} depends on modules the cache fingerprint leaves out: {missing}"


def _calls_and_defs():
    calls, defs = [], []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                calls.append((node.func.id, name))
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defs.append((node.name, name))
    return calls, defs


def test_one_home_for_each_rule():
    """Rules that drifted apart when they had two homes: a SimResult is assembled in one
    function, and which nodes carry SIMD vectors is decided in one."""
    calls, defs = _calls_and_defs()
    assert sorted({m for f, m in calls if f == "SimResult"}) == ["dataflow.pe_array.assemble"]
    assert [m for f, m in defs if f == "vector_nodes"] == ["dataflow.dfg.graph"]
    assert [m for f, m in defs if f == "accumulates"] == ["dataflow.dfg.ops"]
