"""The tree stays lint-clean and its functions short (issue 17 point 9).

`ruff check` runs with the settings in pyproject.toml ([tool.ruff.lint]: pycodestyle, pyflakes,
import order, bugbear, McCabe complexity); the AST check holds every function in dataflow/ to
MAX_FUNCTION_LINES lines, so a long function is split into named steps rather than grown.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINTED = ("dataflow", "tests", "benchmarks", "scripts")
# the hard limit of issue 17 point 9: a function over it reads as several steps, so it is split
MAX_FUNCTION_LINES = 100


def test_ruff_finds_nothing():
    if importlib.util.find_spec("ruff") is None:
        pytest.skip("ruff is not installed in this interpreter (pip install -e '.[dev]')")
    paths = [p for p in LINTED if (ROOT / p).is_dir()]
    run = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache",
                          "--output-format", "concise", *paths],
                         cwd=ROOT, capture_output=True, text=True, check=False)
    assert run.returncode == 0, f"ruff check {' '.join(paths)}:\n{run.stdout}{run.stderr}"


def _long_functions(package: Path, limit: int) -> list[str]:
    """`path:line name (n lines)` for every function or method of more than `limit` lines."""
    found = []
    for path in sorted(package.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} "
                                 f"({lines} lines)")
    return found


def test_no_function_over_the_line_limit():
    long = _long_functions(ROOT / "dataflow", MAX_FUNCTION_LINES)
    assert not long, (f"functions over {MAX_FUNCTION_LINES} lines (split them into named "
                      "steps):\n" + "\n".join(long))


def test_the_line_check_sees_a_long_function(tmp_path):
    """The AST check itself: a 101-line function is found, a 100-line one is not."""
    body = "\n".join(f"    x{i} = {i}" for i in range(99))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(f"def short():\n{body}\n\n\n"
                                           f"def long():\n{body}\n    x = 1\n")
    assert _long_functions(tmp_path / "pkg", MAX_FUNCTION_LINES) == [
        "pkg/m.py:103 long (101 lines)"]
