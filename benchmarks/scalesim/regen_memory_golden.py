"""Regenerate tests/data/scalesim_memory_golden.json: SCALE-Sim 3.0.0 with
``InterfaceBandwidth: USER`` on GEMMs with SRAMs small enough that every buffer refetches (the
read buffers' set windows shift, the ofmap buffer drains and fills), for
``dataflow/pe_array/systolic_memory.py``'s port of its memory model.

    DATAFLOW_SCALESIM_PYTHON=/work/scalesim-venv-topo/bin/python \\
        python3 benchmarks/scalesim/regen_memory_golden.py

About 5 s on the 2-core dev box.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_scalesim as rs  # noqa: E402

OUT = HERE.parents[1] / "tests" / "data" / "scalesim_memory_golden.json"
SHAPES = ((64, 64, 64), (100, 40, 70), (33, 70, 50))  # M, N, K
SRAM_KB = (1, 2)  # SCALE-Sim kB = 1024 words, each of ifmap / filter / ofmap
BANDWIDTH = 10  # words/cycle on each DRAM link
ROWS = COLS = 32


def main():
    py = rs.scalesim_python()
    if py is None:
        sys.exit("no python with scalesim available (set DATAFLOW_SCALESIM_PYTHON)")
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        topo = Path(tmp) / "gemm.csv"
        topo.write_text("Layer, M, N, K,\n" + "".join(
            f"g{i}, {m}, {n}, {k},\n" for i, (m, n, k) in enumerate(SHAPES)))
        for df in rs.VALID_DATAFLOWS:
            for kb in SRAM_KB:
                res = rs.run_scalesim_topology_subprocess(topo, df, True, ROWS, COLS,
                                                          bandwidth=BANDWIDTH,
                                                          sram_kb=(kb, kb, kb), python=py)
                for (m, n, k), layer in zip(SHAPES, res["layers"]):
                    records.append(dict(m=m, n=n, k=k, dataflow=df, sram_words=1024 * kb,
                                        **layer))
    OUT.write_text(json.dumps({"header": {
        "produced_by": "benchmarks/scalesim/regen_memory_golden.py",
        "scalesim_version": rs.SCALESIM_VERSION, "rows": ROWS, "cols": COLS,
        "bandwidth_words_per_cycle": BANDWIDTH}, "records": records}, indent=1) + "\n")
    print(f"wrote {OUT} ({len(records)} records)")


if __name__ == "__main__":
    main()
