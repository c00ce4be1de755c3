"""Run SCALE-Sim 3.0.0 on a single dense GEMM and report its compute cycles.

This file is both a script and an importable module.

* In an environment that can ``import scalesim`` (SCALE-Sim 3.0.0 needs
  ``numpy<2.4``, so it lives in its own virtualenv, e.g. ``/work/scalesim-venv``)
  :func:`run_scalesim` runs the simulator in-process.
* From the main ``dataflow`` environment (numpy 2.4, no scalesim) use
  :func:`run_scalesim_subprocess`, which re-executes this file with the python
  returned by :func:`scalesim_python` and reads a JSON dict from its stdout.

Command line (must be run with the scalesim venv's python)::

    /work/scalesim-venv/bin/python benchmarks/scalesim/run_scalesim.py M N K DATAFLOW \
        [--rows 32] [--cols 32]

prints ``{"total_cycles": ..., "stall_cycles": ..., "wall_seconds": ...}``; and for a topology
file as it is (``--bandwidth W``: ``InterfaceBandwidth: USER`` at W words/cycle)::

    .../python benchmarks/scalesim/run_scalesim.py topology FILE DATAFLOW [--gemm] \
        [--bandwidth W] [--sram-kb IFMAP FILTER OFMAP]

prints ``{"layers": [{"total_cycles", "total_cycles_incl_prefetch", "stall_cycles"}, ...],
"wall_seconds": ...}``.

GEMM convention (SCALE-Sim ``topology_utils.load_arrays_gemm``): the ifmap
operand is M x K, the filter K x N and the ofmap M x N.

Setup written to the .cfg: ``InterfaceBandwidth = CALC`` (bandwidth-estimate
mode: SRAMs are never starved, so stall cycles are 0), generous SRAM sizes,
sparsity and custom layouts off.  The reported figure is the "Total Cycles"
column of ``COMPUTE_REPORT.csv`` (not "Total Cycles (incl. prefetch)").
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCALESIM_VERSION = "3.0.0"
VALID_DATAFLOWS = ("os", "ws", "is")

# SRAM sizes (kB as SCALE-Sim names them; kilo-words in its docs).  Large enough
# that no GEMM we use overflows the double buffers; they do not change the
# compute cycle count in CALC mode.
SRAM_KB = 65536

_CFG_TEMPLATE = """\
[general]
run_name = {run_name}

[architecture_presets]
ArrayHeight:    {rows}
ArrayWidth:     {cols}
IfmapSramSzkB:   {sram_ifmap}
FilterSramSzkB:  {sram_filter}
OfmapSramSzkB:   {sram_ofmap}
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Dataflow : {dataflow}
Bandwidth : {bandwidth}
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: {bandwidth}
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: {bandwidth}
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: {interface}
UseRamulatorTrace: False
"""


def config_text(run_name, dataflow, rows=32, cols=32, bandwidth=None, sram_kb=None):
    """The .cfg text. ``bandwidth=None``: ``InterfaceBandwidth: CALC``; an int ``w``:
    ``InterfaceBandwidth: USER`` with ``w`` words/cycle on every backing link. SCALE-Sim 3.0.0
    (``single_layer_sim.py``) takes the ifmap and filter DRAM links from the [layout]
    ``IfmapSRAMBankBandwidth`` / ``FilterSRAMBankBandwidth`` keys and only the ofmap link from
    ``Bandwidth``, so all three are set to ``w``. ``sram_kb``: (ifmap, filter, ofmap) SRAM
    sizes in SCALE-Sim's kB (1024 words: its word size is 1 byte); default ``SRAM_KB`` each."""
    sram_if, sram_f, sram_of = sram_kb or (SRAM_KB, SRAM_KB, SRAM_KB)
    return _CFG_TEMPLATE.format(run_name=run_name, rows=rows, cols=cols, dataflow=dataflow,
                                sram_ifmap=sram_if, sram_filter=sram_f, sram_ofmap=sram_of,
                                bandwidth=10 if bandwidth is None else int(bandwidth),
                                interface="CALC" if bandwidth is None else "USER")


def write_inputs(workdir, m, n, k, dataflow, rows=32, cols=32, run_name="gemm"):
    """Write config, GEMM topology and layout CSVs into ``workdir``.

    Returns ``(cfg_path, topo_path, layout_path)``.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    cfg = workdir / "scalesim.cfg"
    topo = workdir / "gemm_topo.csv"
    layout = workdir / "gemm_layout.csv"
    cfg.write_text(config_text(run_name, dataflow, rows, cols))
    # Every row must end with a trailing comma: SCALE-Sim does row.split(',')[:-1].
    topo.write_text("Layer, M, N, K,\n" f"gemm, {m}, {n}, {k},\n")
    # Needed even with custom layouts off; a header line is enough.
    layout.write_text("Layer name, x,\n")
    return cfg, topo, layout


def parse_compute_report(path):
    """Return (total_cycles, stall_cycles) of the first layer in COMPUTE_REPORT.csv."""
    with open(path, newline="") as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh) if any(c.strip() for c in r)]
    header, first = rows[0], rows[1]
    idx = {name: i for i, name in enumerate(header)}
    total = first[idx["Total Cycles"]]
    stall = first[idx["Stall Cycles"]]
    return int(float(total)), int(float(stall))


def parse_compute_report_layers(path):
    """Every layer of COMPUTE_REPORT.csv: dicts with ``total_cycles`` ("Total Cycles"),
    ``total_cycles_incl_prefetch`` and ``stall_cycles``, in file order."""
    with open(path, newline="") as fh:
        rows = [[c.strip() for c in r] for r in csv.reader(fh) if any(c.strip() for c in r)]
    idx = {name: i for i, name in enumerate(rows[0])}
    return [dict(total_cycles=int(float(r[idx["Total Cycles"]])),
                 total_cycles_incl_prefetch=int(float(r[idx["Total Cycles (incl. prefetch)"]])),
                 stall_cycles=int(float(r[idx["Stall Cycles"]]))) for r in rows[1:]]


def run_scalesim_topology(topology, dataflow, gemm, rows=32, cols=32, bandwidth=None,
                          sram_kb=None, workdir=None):
    """Run SCALE-Sim (in-process) on a topology file as it is (``gemm``: rows ``Layer, M, N,
    K,``; else conv rows). ``bandwidth``/``sram_kb`` as in :func:`config_text`.

    Returns ``dict(layers=[...], wall_seconds=float)``, ``layers`` as
    :func:`parse_compute_report_layers`.
    """
    if dataflow not in VALID_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {VALID_DATAFLOWS}, got {dataflow!r}")
    from scalesim.scale_sim import scalesim  # only importable in the scalesim venv

    tmp = tempfile.mkdtemp(prefix="scalesim_") if workdir is None else None
    workdir = Path(tmp or workdir)
    try:
        run_name = "topo"
        cfg = workdir / "scalesim.cfg"
        cfg.write_text(config_text(run_name, dataflow, rows, cols, bandwidth, sram_kb))
        layout = workdir / "layout.csv"
        layout.write_text("Layer name, x,\n")
        out = workdir / "out"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        sim = scalesim(save_disk_space=True, verbose=False, config=str(cfg),
                       topology=str(Path(topology).resolve()), layout=str(layout),
                       input_type_gemm=gemm)
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            sim.run_scale(top_path=str(out))
        wall = time.perf_counter() - t0
        return dict(layers=parse_compute_report_layers(out / run_name / "COMPUTE_REPORT.csv"),
                    wall_seconds=wall)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def run_scalesim(m, n, k, dataflow, rows=32, cols=32, workdir=None):
    """Run SCALE-Sim (in-process) on GEMM ifmap MxK @ filter KxN on a rows x cols array.

    Returns ``dict(total_cycles=int, stall_cycles=int, wall_seconds=float)`` where
    ``wall_seconds`` is the time spent inside ``scalesim.run_scale``.
    """
    if dataflow not in VALID_DATAFLOWS:
        raise ValueError(f"dataflow must be one of {VALID_DATAFLOWS}, got {dataflow!r}")
    from scalesim.scale_sim import scalesim  # only importable in the scalesim venv

    tmp = None
    if workdir is None:
        tmp = tempfile.mkdtemp(prefix="scalesim_")
        workdir = tmp
    try:
        run_name = "gemm"
        cfg, topo, layout = write_inputs(workdir, m, n, k, dataflow, rows, cols, run_name)
        out = Path(workdir) / "out"
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        sim = scalesim(save_disk_space=True, verbose=False, config=str(cfg),
                       topology=str(topo), layout=str(layout), input_type_gemm=True)
        # SCALE-Sim prints a banner even with verbose=False; keep stdout clean
        # for the JSON protocol used by run_scalesim_subprocess().
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):
            sim.run_scale(top_path=str(out))
        wall = time.perf_counter() - t0
        total, stall = parse_compute_report(out / run_name / "COMPUTE_REPORT.csv")
        return dict(total_cycles=total, stall_cycles=stall, wall_seconds=wall)
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def scalesim_python():
    """Path of a python interpreter that can ``import scalesim``, or None.

    Search order: ``$DATAFLOW_SCALESIM_PYTHON``, ``/work/scalesim-venv/bin/python``,
    ``<repo>/.venv-scalesim/bin/python``.
    """
    repo_root = Path(__file__).resolve().parents[2]
    candidates = [os.environ.get("DATAFLOW_SCALESIM_PYTHON"),
                  "/work/scalesim-venv/bin/python",
                  str(repo_root / ".venv-scalesim" / "bin" / "python")]
    for cand in candidates:
        if not cand or not os.path.exists(cand):
            continue
        try:
            r = subprocess.run([cand, "-c", "import scalesim.scale_sim"],
                               capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            continue
        if r.returncode == 0:
            return cand
    return None


def run_scalesim_subprocess(m, n, k, dataflow, rows=32, cols=32, python=None, timeout=None):
    """Run :func:`run_scalesim` in the scalesim venv via a subprocess.

    Usable from an environment that cannot import scalesim.  Returns the same dict.
    Raises RuntimeError if no suitable python is found or the run fails.
    """
    python = python or scalesim_python()
    if python is None:
        raise RuntimeError("no python with scalesim found (set DATAFLOW_SCALESIM_PYTHON or "
                           "create /work/scalesim-venv)")
    cmd = [python, str(Path(__file__).resolve()), str(m), str(n), str(k), dataflow,
           "--rows", str(rows), "--cols", str(cols)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"scalesim run failed ({r.returncode}): {r.stderr[-2000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "topology":
        return main_topology(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("m", type=int)
    ap.add_argument("n", type=int)
    ap.add_argument("k", type=int)
    ap.add_argument("dataflow", choices=VALID_DATAFLOWS)
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args(argv)
    res = run_scalesim(a.m, a.n, a.k, a.dataflow, a.rows, a.cols, a.workdir)
    print(json.dumps(res))


def main_topology(argv):
    """``topology FILE DATAFLOW [--gemm] [--rows R --cols C] [--bandwidth W]
    [--sram-kb IF F OF]``: prints :func:`run_scalesim_topology`'s dict as JSON."""
    ap = argparse.ArgumentParser(prog="run_scalesim.py topology")
    ap.add_argument("topology")
    ap.add_argument("dataflow", choices=VALID_DATAFLOWS)
    ap.add_argument("--gemm", action="store_true")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--cols", type=int, default=32)
    ap.add_argument("--bandwidth", type=int, default=None)
    ap.add_argument("--sram-kb", type=int, nargs=3, default=None)
    a = ap.parse_args(argv)
    res = run_scalesim_topology(a.topology, a.dataflow, a.gemm, a.rows, a.cols, a.bandwidth,
                                a.sram_kb)
    print(json.dumps(res))


def run_scalesim_topology_subprocess(topology, dataflow, gemm, rows=32, cols=32,
                                     bandwidth=None, sram_kb=None, python=None, timeout=None):
    """:func:`run_scalesim_topology` in the scalesim venv via a subprocess (same dict)."""
    python = python or scalesim_python()
    if python is None:
        raise RuntimeError("no python with scalesim found (set DATAFLOW_SCALESIM_PYTHON or "
                           "create /work/scalesim-venv)")
    cmd = [python, str(Path(__file__).resolve()), "topology", str(topology), dataflow,
           "--rows", str(rows), "--cols", str(cols)]
    if gemm:
        cmd.append("--gemm")
    if bandwidth is not None:
        cmd += ["--bandwidth", str(bandwidth)]
    if sram_kb is not None:
        cmd += ["--sram-kb", *map(str, sram_kb)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise RuntimeError(f"scalesim run failed ({r.returncode}): {r.stderr[-2000:]}")
    lines = [ln for ln in r.stdout.splitlines() if ln.strip()]
    return json.loads(lines[-1])


if __name__ == "__main__":
    main()
