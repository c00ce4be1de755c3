"""Every notebook under notebooks/ executes top to bottom without an error.

Each notebook runs in a fresh ``python3`` kernel (ipykernel; jupyter_client maps the spec's
``python`` to this interpreter, and ipykernel's native ``python3`` kernel is available even
when no kernelspec is installed) with ``MPLBACKEND=Agg``, its working directory the notebook's
folder, and a time limit of 300 s per notebook (each cell gets what the notebook has left).
nbclient, nbformat and ipykernel come with the ``dev`` extra; without them the test fails.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TIMEOUT_S = 300


def test_notebooks_exist():
    """An empty notebooks/ folder must fail, not pass vacuously."""
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, monkeypatch):
    import ipykernel  # noqa: F401  (the kernel the notebooks run in)
    import nbclient
    import nbformat

    # the kernel inherits this environment: a headless matplotlib, and the repository on the
    # path even when the package is not installed
    monkeypatch.setenv("MPLBACKEND", "Agg")
    root = str(NOTEBOOK_DIR.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH", "")) if p))

    nb = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + TIMEOUT_S
    client = nbclient.NotebookClient(
        nb, timeout=TIMEOUT_S, kernel_name="python3",
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed:\n{err}", pytrace=False)
    except nbclient.exceptions.CellTimeoutError as err:
        pytest.fail(f"{path.name} ran past its {TIMEOUT_S} s:\n{err}", pytrace=False)
    assert time.monotonic() <= deadline + 1, f"{path.name} ran past its {TIMEOUT_S} s"
