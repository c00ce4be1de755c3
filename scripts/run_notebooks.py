"""Execute every notebooks/*.ipynb in place, so the committed notebooks show their outputs and
pictures to a reader browsing the repository.

    python scripts/run_notebooks.py            # all notebooks
    python scripts/run_notebooks.py 03 05      # those whose names start with 03 or 05

Each notebook runs top to bottom in a fresh ``python3`` kernel on this interpreter (the same
set-up as ``tests/test_notebooks.py``, which executes them again without writing back):
``MPLBACKEND=Agg`` (the notebooks' ``%matplotlib inline`` draws the pictures as PNG), the
repository on ``PYTHONPATH``, the notebook's folder as working directory, and an empty plan
cache folder, so every plan is built and the notes read alike from run to run. Cell timings
are not recorded and each PNG is stored with a 256-colour palette (a third of the bytes; plots
have few colours), so the diffs stay small; warnings on stderr that name this install's
site-packages are not stored. A notebook that fails is left as it was and the
script exits with 1. Needs the ``notebooks`` or ``dev`` extra (nbclient, nbformat, ipykernel).
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK_DIR = ROOT / "notebooks"
TIMEOUT_S = 600  # per cell
MAX_OUTPUT_BYTES = 400_000  # per notebook: a bigger one is a sign of a runaway print or image


def kernel_manager(spec_root: Path) -> AsyncKernelManager:
    """A kernel manager for a ``python3`` kernel running this interpreter."""
    spec_dir = spec_root / "python3"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(spec_root)], ensure_native_kernel=False)
    return AsyncKernelManager(kernel_name="python3", kernel_spec_manager=ksm)


def small_png(b64: str) -> str:
    """The base64 PNG re-encoded with an adaptive 256-colour palette."""
    image = Image.open(io.BytesIO(base64.b64decode(b64))).convert("RGB")
    buf = io.BytesIO()
    image.quantize(256, method=Image.Quantize.MEDIANCUT).save(buf, "png", optimize=True)
    return base64.b64encode(buf.getvalue()).decode() + "\n"


def run_one(path: Path, scratch: Path) -> int:
    """Execute `path` and write it back with its outputs; returns the size of the outputs."""
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, km=kernel_manager(scratch / "kernels"), kernel_name="python3", timeout=TIMEOUT_S,
        record_timing=False, resources={"metadata": {"path": str(path.parent)}})
    client.execute()
    for cell in nb.cells:
        if "outputs" in cell:  # this install's library warnings (its paths) stay here
            cell.outputs = [o for o in cell.outputs if not (
                o.get("name") == "stderr" and "site-packages" in o.get("text", ""))]
        for out in cell.get("outputs", []):
            if "image/png" in out.get("data", {}):
                out["data"]["image/png"] = small_png(out["data"]["image/png"])
    size = sum(len(json.dumps(c.get("outputs", []))) for c in nb.cells)
    if size > MAX_OUTPUT_BYTES:
        raise RuntimeError(f"{path.name}: outputs hold {size} bytes (limit {MAX_OUTPUT_BYTES})")
    nbformat.write(nb, path)
    return size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("prefixes", nargs="*", help="run only notebooks whose names start so")
    args = ap.parse_args(argv)
    paths = [p for p in sorted(NOTEBOOK_DIR.glob("*.ipynb"))
             if not args.prefixes or p.name.startswith(tuple(args.prefixes))]
    if not paths:
        print(f"no notebooks match {args.prefixes} in {NOTEBOOK_DIR}", file=sys.stderr)
        return 1
    os.environ["MPLBACKEND"] = "Agg"  # the kernel inherits this environment
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    failed = []
    for path in paths:
        with tempfile.TemporaryDirectory() as scratch:
            os.environ["DATAFLOW_CACHE_DIR"] = str(Path(scratch) / "plans")
            start = time.monotonic()
            try:
                size = run_one(path, Path(scratch))
            except (nbclient.exceptions.CellExecutionError, RuntimeError) as err:
                print(f"FAILED {path.name}:\n{err}", file=sys.stderr)
                failed.append(path.name)
                continue
        print(f"ran {path.name} in {time.monotonic() - start:.0f} s ({size / 1000:.0f} kB of "
              "outputs)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
