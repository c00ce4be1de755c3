"""Regenerate tests/data/scalesim_topology_golden.json from SCALE-Sim 3.0.0.

Runs SCALE-Sim on every topology file of ``TOPOLOGIES`` (``models/topologies/``) as it is, for
os, ws and is on the systolic preset's array (``arch_configs/systolic_32x32.yaml``), twice:

* ``InterfaceBandwidth: CALC`` (no stalls): per-layer "Total Cycles", the compute figure;
* ``InterfaceBandwidth: USER`` at ``USER_BANDWIDTH_WORDS`` words/cycle on each of SCALE-Sim's
  three DRAM links (ifmap, filter, ofmap) and the per-operand SRAM sizes of the arch YAML
  (``spm.capacity_words_per_line`` words per line; SCALE-Sim's kB are 1024 of its 1-byte
  words): "Total Cycles", "Total Cycles (incl. prefetch)" and "Stall Cycles".

Run from the main environment (it needs ``dataflow`` to read the arch YAML); SCALE-Sim runs in
its own venv through ``run_scalesim.run_scalesim_topology_subprocess``::

    DATAFLOW_SCALESIM_PYTHON=/work/scalesim-venv/bin/python \\
        PYTHONPATH=$PWD python3 benchmarks/scalesim/regen_topology_golden.py

About 6 minutes on the 2-core dev box (each file's runs are printed with their wall time).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_scalesim as rs  # noqa: E402

from dataflow.arch import load_arch  # noqa: E402

REPO_ROOT = HERE.parents[1]
DEFAULT_OUT = REPO_ROOT / "tests" / "data" / "scalesim_topology_golden.json"
ARCH = REPO_ROOT / "arch_configs" / "systolic_32x32.yaml"
TOPOLOGIES = ("small_conv.csv", "gemm_layers.csv", "resnet18_stage2.csv",
              "resnet18_conv1.csv")
DATAFLOWS = ("os", "ws", "is")
# words/cycle on each DRAM link; SCALE-Sim needs a multiple of its 10 SRAM banks
USER_BANDWIDTH_WORDS = 10


def _is_gemm(path: Path) -> bool:
    head = path.read_text().splitlines()[0]
    return [c.strip().lower() for c in head.split(",")][1:4] == ["m", "n", "k"]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    a = ap.parse_args(argv)
    py = rs.scalesim_python()
    if py is None:
        sys.exit("no python with scalesim available (set DATAFLOW_SCALESIM_PYTHON)")
    ss_version, np_version = subprocess.check_output(
        [py, "-c", "import numpy; from importlib.metadata import version; "
                   "print(version('scalesim'), numpy.__version__)"], text=True).split()
    if ss_version != rs.SCALESIM_VERSION:
        sys.exit(f"expected scalesim {rs.SCALESIM_VERSION}, found {ss_version}")
    arch = load_arch(ARCH)
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    sram_words = arch.spm.capacity_words_per_line
    sram_kb = (sram_words // 1024,) * 3
    files = {}
    t_all = time.perf_counter()
    for name in TOPOLOGIES:
        path = REPO_ROOT / "models" / "topologies" / name
        gemm = _is_gemm(path)
        per_df = {}
        for df in DATAFLOWS:
            calc = rs.run_scalesim_topology_subprocess(path, df, gemm, rows, cols, python=py)
            user = rs.run_scalesim_topology_subprocess(
                path, df, gemm, rows, cols, bandwidth=USER_BANDWIDTH_WORDS, sram_kb=sram_kb,
                python=py)
            per_df[df] = {"calc": calc["layers"], "user": user["layers"],
                          "wall_seconds": {"calc": round(calc["wall_seconds"], 2),
                                           "user": round(user["wall_seconds"], 2)}}
            print(f"{name} {df}: calc {[x['total_cycles'] for x in calc['layers']]} "
                  f"({calc['wall_seconds']:.1f} s), user "
                  f"{[(x['total_cycles'], x['stall_cycles']) for x in user['layers']]} "
                  f"({user['wall_seconds']:.1f} s)", flush=True)
        files[name] = {"gemm": gemm, "dataflows": per_df}
    doc = {
        "header": {
            "description": "SCALE-Sim per-layer COMPUTE_REPORT figures for the topology files "
                           "under models/topologies/ (rows in file order)",
            "produced_by": "benchmarks/scalesim/regen_topology_golden.py (via run_scalesim.py)",
            "scalesim_version": ss_version, "numpy_version": np_version,
            "python": platform.python_version(), "scalesim_python": py,
            "arch": str(ARCH.relative_to(REPO_ROOT)),
            "config": {"ArrayHeight": rows, "ArrayWidth": cols,
                       "calc": {"InterfaceBandwidth": "CALC", "SramSzkB": rs.SRAM_KB},
                       "user": {"InterfaceBandwidth": "USER",
                                "Bandwidth(words/cycle, each of ifmap/filter/ofmap)":
                                    USER_BANDWIDTH_WORDS,
                                "SramSzkB(ifmap/filter/ofmap)": list(sram_kb),
                                "from": "spm.capacity_words_per_line / 1024"},
                       "SparsitySupport": False, "CustomLayout": False},
            "generated_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "total_wall_seconds": round(time.perf_counter() - t_all, 1),
        },
        "files": files,
    }
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
