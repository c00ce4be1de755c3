"""Every notebook under notebooks/ executes top to bottom without an error.

Each notebook runs in a fresh ipykernel ``python3`` kernel on *this* interpreter: the test
writes its own ``python3`` kernelspec (``sys.executable -m ipykernel_launcher``) into a temporary
folder, so neither a missing kernelspec (no ``python -m ipykernel install`` is needed) nor a
user-level one pointing at another Python can get in the way. The kernel gets
``MPLBACKEND=Agg``, the repository on ``PYTHONPATH`` and the notebook's folder as its working
directory, and a time limit of 300 s per notebook (each cell gets what the notebook has left).
nbclient, nbformat and ipykernel come with the ``dev`` extra; without them the test fails.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

NOTEBOOK_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
TIMEOUT_S = 300


def test_notebooks_exist():
    """An empty notebooks/ folder must fail, not pass vacuously."""
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOK_DIR}"


def _kernel_manager(spec_root: Path):
    """An AsyncKernelManager for a ``python3`` kernel running this interpreter."""
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import AsyncKernelManager

    spec_dir = spec_root / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (tests)",
        "language": "python",
    }))
    ksm = KernelSpecManager(kernel_dirs=[str(spec_root)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm)


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_executes(path: Path, monkeypatch, tmp_path):
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
        nb, km=_kernel_manager(tmp_path / "kernels"), kernel_name="python3",
        timeout=TIMEOUT_S,
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic())),
        resources={"metadata": {"path": str(path.parent)}})
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as err:
        pytest.fail(f"{path.name} failed:\n{err}", pytrace=False)
    except nbclient.exceptions.CellTimeoutError as err:
        pytest.fail(f"{path.name} ran past its {TIMEOUT_S} s:\n{err}", pytrace=False)
    assert time.monotonic() <= deadline + 1, f"{path.name} ran past its {TIMEOUT_S} s"
