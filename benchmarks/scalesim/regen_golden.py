"""Regenerate tests/data/scalesim_golden.json from SCALE-Sim 3.0.0.

Runs a fixed list of dense GEMM shapes x {os, ws, is} on a 32x32 systolic array
and records SCALE-Sim's COMPUTE_REPORT "Total Cycles" / "Stall Cycles".

Usage (either python works; from the main environment the runs go through a
subprocess into the scalesim venv)::

    /work/scalesim-venv/bin/python benchmarks/scalesim/regen_golden.py
    python benchmarks/scalesim/regen_golden.py      # uses run_scalesim_subprocess

Takes ~15 s on the 2-core dev box (256^3 runs ~1.4 s each here; docs/references.md#scale-sim).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_scalesim as rs

REPO_ROOT = HERE.parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "scalesim_golden.json"

ROWS = COLS = 32
DATAFLOWS = ("os", "ws", "is")
# (M, N, K) with SCALE-Sim's GEMM convention: ifmap MxK, filter KxN, ofmap MxN.
SHAPES = [
    (1, 1, 1),
    (7, 5, 3),
    (1, 32, 1),
    (32, 1, 32),
    (32, 32, 32),
    (31, 33, 32),
    (33, 65, 31),
    (64, 64, 64),
    (64, 16, 128),
    (100, 17, 300),
    (17, 100, 45),
    (128, 96, 200),
    (200, 3, 70),
    (96, 128, 33),
    (65, 1, 97),
    (160, 64, 10),
    (256, 256, 256),
]


def _have_inprocess_scalesim():
    try:
        import scalesim.scale_sim  # noqa: F401
        return True
    except Exception:
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    a = ap.parse_args(argv)

    inproc = _have_inprocess_scalesim()
    if inproc:
        from importlib.metadata import version

        import numpy
        import scalesim  # noqa: F401
        ss_version = version("scalesim")
        np_version = numpy.__version__
        py = sys.executable
        run = rs.run_scalesim
    else:
        py = rs.scalesim_python()
        if py is None:
            sys.exit("no python with scalesim available")
        import subprocess
        ss_version, np_version = subprocess.check_output(
            [py, "-c", "import numpy; from importlib.metadata import version; "
                       "print(version('scalesim'), numpy.__version__)"], text=True).split()

        def run(m, n, k, df, r, c):
            return rs.run_scalesim_subprocess(m, n, k, df, r, c, python=py)
    if ss_version != rs.SCALESIM_VERSION:
        sys.exit(f"expected scalesim {rs.SCALESIM_VERSION}, found {ss_version}")

    records = []
    t_all = time.perf_counter()
    for (m, n, k) in SHAPES:
        for df in DATAFLOWS:
            res = run(m, n, k, df, ROWS, COLS)
            rec = dict(m=m, n=n, k=k, dataflow=df, rows=ROWS, cols=COLS,
                       total_cycles=int(res["total_cycles"]),
                       stall_cycles=int(res["stall_cycles"]),
                       scalesim_version=ss_version)
            records.append(rec)
            print(f"{m:4d} {n:4d} {k:4d} {df}: total={rec['total_cycles']:8d} "
                  f"stall={rec['stall_cycles']} ({res['wall_seconds']:.2f} s)", flush=True)

    doc = {
        "header": {
            "description": "SCALE-Sim compute cycles (COMPUTE_REPORT.csv 'Total Cycles', not "
                           "'incl. prefetch') for dense GEMM; ifmap MxK, filter KxN, ofmap MxN.",
            "produced_by": "benchmarks/scalesim/regen_golden.py (via run_scalesim.py)",
            "scalesim_version": ss_version,
            "numpy_version": np_version,
            "python": platform.python_version(),
            "scalesim_python": py,
            "api": "scalesim.scale_sim.scalesim(save_disk_space=True, verbose=False, "
                   "input_type_gemm=True).run_scale()",
            "config": {"ArrayHeight": ROWS, "ArrayWidth": COLS,
                       "SramSzkB(ifmap/filter/ofmap)": rs.SRAM_KB,
                       "InterfaceBandwidth": "CALC", "SparsitySupport": False,
                       "CustomLayout": False},
            "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "total_wall_seconds": round(time.perf_counter() - t_all, 1),
            "closed_form": "benchmarks/scalesim/closed_form.py:scalesim_compute_cycles",
        },
        "records": records,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(records)} records to {out}")


if __name__ == "__main__":
    main()
