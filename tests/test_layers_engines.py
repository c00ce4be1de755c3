"""The two engines check each other only if neither borrows code from the other: each may
import the shared rules (pe_array/semantics.py, pe_array/common.py) but nothing from the other
engine's module. Checked on the source (ast), so no import has to run."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PE_ARRAY = Path(__file__).resolve().parent.parent / "dataflow" / "pe_array"
PACKAGE = "dataflow.pe_array"
ENGINES = {"reference": "fast", "fast": "reference"}  # engine -> the module it must not import


def imported_modules(module: str) -> set[str]:
    """Dotted names of every module that `dataflow/pe_array/<module>.py` imports, with
    relative imports resolved and `from package import name` counted as package.name."""
    tree = ast.parse((PE_ARRAY / f"{module}.py").read_text(), filename=f"{module}.py")
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = PACKAGE.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{node.module}" if node.module else parent
            else:
                base = node.module
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def test_the_parser_sees_every_import_form(tmp_path, monkeypatch):
    source = ("import dataflow.pe_array.fast\nfrom dataflow.pe_array import fast\n"
              "from .fast import commit\nfrom . import reference\n")
    (tmp_path / "probe.py").write_text(source)
    monkeypatch.setattr(f"{__name__}.PE_ARRAY", tmp_path)
    assert {f"{PACKAGE}.fast", f"{PACKAGE}.reference"} <= imported_modules("probe")
    assert f"{PACKAGE}.fast.commit" in imported_modules("probe")


@pytest.mark.parametrize("engine", list(ENGINES))
def test_an_engine_imports_nothing_from_the_other(engine):
    other = f"{PACKAGE}.{ENGINES[engine]}"
    borrowed = {m for m in imported_modules(engine) if m == other or m.startswith(other + ".")}
    assert not borrowed, f"{engine}.py imports {sorted(borrowed)} from {ENGINES[engine]}.py"


@pytest.mark.parametrize("engine", list(ENGINES))
def test_an_engine_takes_its_value_rules_from_semantics(engine):
    assert f"{PACKAGE}.semantics" in imported_modules(engine)


def test_semantics_imports_no_engine():
    imported = imported_modules("semantics")
    assert not {m for m in imported for e in ENGINES if m.startswith(f"{PACKAGE}.{e}")}


#: libraries an engine may import where it first uses them: numba's start-up (about 0.9 s) is
#: paid only by runs whose compiled loops pay for it (start-up, issue 14)
DEFERRED_LIBRARIES = {"numba"}


@pytest.mark.parametrize("module", ["reference", "fast", "semantics"])
def test_imports_sit_at_module_top(module):
    tree = ast.parse((PE_ARRAY / f"{module}.py").read_text())
    top = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    late = [n.lineno for n in ast.walk(tree)
            if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top
            and not (isinstance(n, ast.Import)
                     and {a.name.split(".")[0] for a in n.names} <= DEFERRED_LIBRARIES)]
    assert not late, f"{module}.py imports inside a function or block at lines {late}"
