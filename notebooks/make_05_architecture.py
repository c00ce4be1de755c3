"""Builds notebooks/05_architecture.ipynb (committed without outputs; CI executes it).

    python notebooks/make_05_architecture.py
"""

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    ("md", """# 05 · How SPM lines, ports and links change a schedule

Every field of an `ArchSpec` changes what the mapper can do and what the engine measures. This
notebook changes one at a time on small cases and shows the effect: SPM port conflicts counted
from the real address streams, the address-to-line policy, link capacity and width, hop latency;
last, one GEMM before and after the compiler's schedule transformations. Pictures come from
`dataflow.report` (the same ones `dataflow report RESULT` writes)."""),
    ("code", """%matplotlib inline
import copy
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import scipy.sparse as sp
from IPython.display import Image, display

from dataflow.arch import arch_from_dict, arch_to_dict, load_arch
from dataflow.dfg.lower import gemm_kernel, lower_gemm, lower_spmm_csr
from dataflow.mapper import map_kernel, map_program
from dataflow.pe_array.simulate import simulate_mapping
from dataflow.report import gantt, result_data, roofline, spm_heatmap

BASE = arch_to_dict(load_arch("../arch_configs/default.yaml"))
OUT = Path(tempfile.mkdtemp())

def arch(**changes):
    \"\"\"The default architecture with dotted-key changes, e.g. arch(**{"spm.lines": 4}).\"\"\"
    d = copy.deepcopy(BASE)
    for key, value in changes.items():
        node = d
        *path, last = key.split(".")
        for p in path:
            node = node[p]
        node[last] = value
    return arch_from_dict(d, source=str(changes))

def show(path):
    display(Image(filename=str(path)))"""),
    ("md", """## SPM lines and ports

A sparse matmul gathers rows of B through A's column indices, so which SPM line each access hits
depends on the data. Here A is the identity and two body copies run rows 0-15 and 16-31: in
every cycle they gather B rows i and i + 16, next to the streams of A's values and indices and
C's accumulations. With `interleaved` address mapping SPM row r lives on line r mod lines; a
line serves `read_ports_per_line` row reads per cycle, and when the busiest line needs more the
whole array (which moves in lock step) waits."""),
    ("code", """rng = np.random.default_rng(0)
a = sp.identity(32, dtype=np.float32, format="csr")
b = rng.standard_normal((32, 8), dtype=np.float32)
prog = lower_spmm_csr(a.shape, a.indptr, a.indices, a.data, b)

rows = []
for lines in (1, 2, 4, 8, 16, 32):
    for ports in (1, 2):
        spec = arch(**{"spm.lines": lines, "spm.read_ports_per_line": ports})
        r = simulate_mapping(map_program(prog, spec, copies=2, max_tile_rows=32))
        rows.append((lines, ports, r.stall_cycles_spm_conflict, r.compute_cycles))
        print(f"lines {lines:>2}  read ports {ports}:  conflict stalls {r.stall_cycles_spm_conflict:>3}, "
              f"array cycles {r.compute_cycles}")

fig, ax = plt.subplots(figsize=(5, 3))
for ports in (1, 2):
    sel = [r for r in rows if r[1] == ports]
    ax.plot([r[0] for r in sel], [r[2] for r in sel], "o-", label=f"{ports} read port(s) per line")
ax.set_xscale("log", base=2)
ax.set_xlabel("SPM lines")
ax.set_ylabel("conflict stall cycles")
ax.legend()
plt.show()"""),
    ("md", """Conflicts fall as lines and ports grow, though not monotonically: which streams meet on
a line depends on the buffers' base rows as well as on the line count (with 4 lines the
allocator's staggered bases happen to separate them better than with 8). With 32 lines and two
ports no access waits. The SPM heatmap shows where traffic and conflicts land."""),
    ("code", """for lines in (4, 32):
    spec = arch(**{"spm.lines": lines, "spm.read_ports_per_line": 1})
    r = simulate_mapping(map_program(prog, spec, copies=2, max_tile_rows=32))
    show(spm_heatmap(result_data(r), OUT / f"spm_{lines}.png"))"""),
    ("md", """## Address-to-line policy

`blocked` gives each line one contiguous range of addresses, so a buffer sits on one line and
all copies streaming it queue at that line's ports; `interleaved` spreads consecutive rows over
all lines."""),
    ("code", """g = lower_gemm(rng.standard_normal((16, 8), dtype=np.float32), rng.standard_normal((8, 16), dtype=np.float32))
fig, ax = plt.subplots(1, 2, figsize=(9, 2.6), sharey=True)
for axis, policy in zip(ax, ("interleaved", "blocked")):
    spec = arch(**{"spm.address_mapping": policy, "spm.capacity_words_per_line": 4096,
                   "spm.read_ports_per_line": 1})
    r = simulate_mapping(map_program(g, spec, copies=8))
    axis.bar(range(spec.spm.lines), r.spm_reads_per_line)
    axis.set_title(f"{policy}: {r.stall_cycles_spm_conflict} conflict stalls, {r.cycles} cycles")
    axis.set_xlabel("SPM line")
ax[0].set_ylabel("row reads")
plt.show()"""),
    ("md", """## Links: hop latency, width and capacity

The mapper routes each value over the interconnect and reserves every (link, cycle mod II). A
longer hop latency stretches the schedule (more fill and drain per tile); a link narrower than a
SIMD vector needs several flits per hop, which delays arrival and fills the links, so the mapper
must spread the copies out or raise II. The Gantt charts show one iteration of each copy (faded:
the following waves, II cycles apart)."""),
    ("code", """kern = gemm_kernel(8, 8, 16)
for label, changes in [("default", {}), ("hop latency 3", {"interconnect.hop_latency_cycles": 3}),
                       ("1-word links", {"interconnect.link_width_words": 1})]:
    spec = arch(**changes)
    km = map_kernel(kern, spec, copies=4)
    hops = sum(len(r.links) for r in km.routes)
    print(f"{label:14} II={km.ii} (MII {km.mii})  schedule length {km.schedule_length:>2}  link hops {hops}")

spec = arch(**{"interconnect.hop_latency_cycles": 3})
r = simulate_mapping(map_program(lower_gemm(rng.standard_normal((4, 8), dtype=np.float32),
                                            rng.standard_normal((8, 16), dtype=np.float32)),
                                 spec, copies=2))
show(gantt(result_data(r), OUT / "gantt_hop3.png", iterations=2))"""),
    ("md", """Link capacity binds when values fan out. In this butterfly-like body every value feeds
two consumers. With one value per link and cycle the mapper's negotiation cannot route it at
II = 1 where the nodes first land; its repair pass moves nodes off congested links and stretches
the schedule to make room (a longer schedule: more fill and drain per tile). When four copies
fill all 64 PEs there is no room to move, and II must rise."""),
    ("code", """from dataflow.dfg.graph import Addr, Buffer, Kernel, Loop, Node
from dataflow.dfg.ops import Op

nodes = [Node(0, Op.LOAD, buffer="X", addr=Addr((("i", 4),))),
         Node(1, Op.LOAD, buffer="X", addr=Addr((("i", 4),), const=1)),
         Node(2, Op.LOAD, buffer="X", addr=Addr((("i", 4),), const=2)),
         Node(3, Op.LOAD, buffer="X", addr=Addr((("i", 4),), const=3))]
for a_, b_ in ((0, 1), (0, 1), (2, 3), (2, 3)):
    nodes.append(Node(len(nodes), Op.ADD if len(nodes) % 2 else Op.SUB, (a_, b_)))
for a_, b_ in ((4, 6), (4, 6), (5, 7), (5, 7)):
    nodes.append(Node(len(nodes), Op.ADD if len(nodes) % 2 else Op.SUB, (a_, b_)))
for j, v in enumerate(range(8, 12)):
    nodes.append(Node(len(nodes), Op.STORE, (v,), buffer="Y", addr=Addr((("i", 4),), const=j)))
fly = Kernel("fly4", (Loop("i", 64),), tuple(nodes), (Buffer("X", 256), Buffer("Y", 256, "output")))
for copies in (2, 4):
    for cap in (1, 2, 4):
        km = map_kernel(fly, arch(**{"interconnect.links_per_direction": cap}), copies=copies)
        print(f"{copies} copies, links per direction {cap}: II = {km.ii} (MII {km.mii}), "
              f"schedule length {km.schedule_length}")"""),
    ("md", """## Where the time goes: the roofline

A result's operational intensity (MACs per DRAM byte) against the array's compute roof and the
DRAM bandwidth roof."""),
    ("code", """r = simulate_mapping(map_program(lower_gemm(rng.standard_normal((64, 32), dtype=np.float32),
                                            rng.standard_normal((32, 32), dtype=np.float32)), arch()))
print(f"{r.cycles} cycles, stalls {r.stall_cycles}, area {r.area_total_mm2:.2f} mm2 {dict(r.area_mm2)}")
show(roofline(result_data(r), OUT / "roofline.png"))"""),
    ("md", """## A GEMM before and after the compiler

`lower_gemm` writes a dense GEMM as one multiply-accumulate per body: `load a, load b, mul, acc`,
four PEs and two SPM row reads for 8 MACs (one SIMD vector of C). Mapped as it is
(`map_program`), the copies fill the array but the lines cannot feed them. The compiler
(`dataflow.plan.compile.compile_gemm`, which `dataflow.simulate("gemm")` calls) rewrites the
body with the passes of `dataflow.dfg.transform` -- fuse `mul` into `acc` (`macc`),
unroll-and-jam (register blocking), row loads of packed operands -- maps every blocking the
array can hold, runs each on the problem's first tile and keeps the fastest. Here one
128 x 128 x 128 GEMM on `default.yaml` (64 PEs x 8 lanes = 512 MACs a cycle), both ways."""),
    ("code", """from dataflow.plan.compile import GemmSchedule, apply_gemm_schedule, compile_gemm
from dataflow.report.plots import CAUSE_COLOURS, layer_roofline
from dataflow.testing import values_match

spec = load_arch("../arch_configs/default.yaml")
rng = np.random.default_rng(1)
A = rng.standard_normal((128, 128), dtype=np.float32)
B = rng.standard_normal((128, 128), dtype=np.float32)
gemm = lower_gemm(A, B)
mappings = {"plain": map_program(gemm, spec)}
mappings["compiled"], chosen = compile_gemm(gemm, spec)
runs = {name: simulate_mapping(m) for name, m in mappings.items()}
print(f"the compiler's choice: {chosen.label()}\\n")
for name, m in mappings.items():
    r, km = runs[name], m.kernels[0]
    ok = values_match(r.output.reshape(128, 128), A.astype(np.float64) @ B)
    print(f"--- {name}: {km.copies} copies x {len(km.kernel.nodes)} nodes, II = {km.ii} "
          f"(MII {km.mii}), schedule length {km.schedule_length}")
    print(m.program.kernels[0])
    print(f"{r.cycles:,} cycles; roofline {r.roofline_cycles:,.0f} ({r.bound}-bound): "
          f"fraction {r.fraction_of_roofline:.3f}; {r.macs / r.cycles:.0f} of "
          f"{r.peak_macs_per_cycle} MACs a cycle; values match numpy: {ok}")
    print("stall cycles:", r.stall_cycles, "\\n")"""),
    ("md", """**Register blocking.** The compiled body is an outer product: `%0` loads one SPM row
of A -- 8 rows of A in one column `kk`, since A is stored in *panels* of 8 rows, each panel column
by column (element (r, c) at (r // 8)·8·128 + c·8 + r % 8, `layout.pack_panels`) -- and
each `macc` takes its lane (`%0.lane0` .. `%0.lane7`). `%1` loads 8 columns of B's row `kk`,
one row of a *column panel* (B stored in panels of 8 columns, each row by row, BLIS's packed B,
`layout.pack_column_panels`). So one row load of A feeds 8 maccs, and the B vector is shared
by all 8: 64 MACs for two row reads instead of 8. The 8 accumulators (rows 8i .. 8i + 7 of C)
stay in their PEs' registers across the whole `kk` reduction. The packed layouts also make
consecutive `kk` walk the SPM lines (an A or B row a step) instead of every copy's stream
piling onto one line, as row-major B does in the plain kernel, where nearly all of the time is
port-conflict stalls. Each transformation's share, mapped and run one at a time:"""),
    ("code", """def line(label, m, r):
    km = m.kernels[0]
    print(f"{label:42} {km.copies:>2} copies, II {km.ii}: {r.cycles:>7,} cycles, fraction "
          f"{r.fraction_of_roofline:.3f}, SPM conflict stalls {r.stall_cycles_spm_conflict:>6,}")

lanes = spec.pe_array.simd_lanes
steps = [("plain (load, load, mul, acc)", GemmSchedule()),
         ("+ macc", GemmSchedule(fuse=True)),
         ("+ 8x1 register block, A in 8-row panels", GemmSchedule(8, 1, fuse=True)),
         ("+ B in column panels", GemmSchedule(8, 1, pack_b=True, fuse=True))]
for label, sched in steps:
    m = map_program(apply_gemm_schedule(gemm, sched, lanes), spec)
    line(label, m, simulate_mapping(m))
line("+ staggered flushes (compile_gemm)", mappings["compiled"], runs["compiled"])"""),
    ("md", """`macc` alone changes nothing here: the plain body is held back by the SPM lines,
not by its PEs. **Forwarding over the links.** Only the two loads touch the SPM; the A row and the B
vector reach the eight `macc` PEs over the interconnect. The mapper routes each value to each
consumer, but a value that several consumers need rides a shared link once (a multicast: the
links carry distinct values, so routes that share a (link, cycle) share the flit). **Staggered
flushes.** The 8 accumulators of a block flush to C rows 128 words apart, which with 16
interleaved lines of 8 words all fall on the *same* line; that line has one write port. The
last pass (`stagger_flushes`) moves each copy's maccs to distinct issue cycles (later, never
earlier: nothing reads them), so their flushes never share a cycle."""),
    ("code", """km = mappings["compiled"].kernels[0]
hop = spec.interconnect.hop_latency_cycles
for src, what in ((0, "A row"), (1, "B vector")):
    routes = [rt for rt in km.routes if rt.copy == 0 and rt.src == src]
    hops = sum(len(rt.links) for rt in routes)
    slots = {(link, rt.depart + h * hop) for rt in routes for h, link in enumerate(rt.links)}
    print(f"copy 0, {what} (node {src}): {len(routes)} consumers, {hops} link hops routed, "
          f"{len(slots)} (link, cycle) slots occupied")
issue = {p.node: p.time for p in km.placements if p.copy == 0}
print("copy 0, issue cycle of each macc:",
      [issue[n.id] for n in km.kernel.nodes if n.op.accumulates])
unstaggered = map_program(apply_gemm_schedule(gemm, chosen, lanes), spec).kernels[0]
issue = {p.node: p.time for p in unstaggered.placements if p.copy == 0}
print("the same schedule before stagger_flushes:",
      [issue[n.id] for n in unstaggered.kernel.nodes if n.op.accumulates])"""),
    ("md", """Where the cycles go in each run: cycles in which the array issued, SPM port-conflict
stalls, waiting for DRAM, reconfiguration, and the drain of the last write-backs."""),
    ("code", """colours = {**CAUSE_COLOURS, "issuing": CAUSE_COLOURS["compute"],
           "write-back drain": "#bbbbbb"}
fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.4), layout="constrained")
for ax, (name, r) in zip(axes, runs.items()):
    parts = {"issuing": r.compute_cycles - r.stall_cycles_spm_conflict,
             "spm_conflict": r.stall_cycles_spm_conflict, "dram_bandwidth": r.stall_cycles_dram,
             "reconfiguration": r.stall_cycles_reconfiguration}
    parts["write-back drain"] = r.cycles - sum(parts.values())
    left = 0
    for part, cycles in parts.items():
        ax.barh(0, cycles, left=left, color=colours[part], label=part if ax is axes[0] else None)
        left += cycles
    ax.axvline(r.roofline_cycles, color="black", ls=":", lw=1,
               label="roofline bound" if ax is axes[0] else None)
    ax.set_yticks([0], [name])
    ax.set_title(f"{name}: {r.cycles:,} cycles", fontsize=8)
axes[-1].set_xlabel("cycles (each run on its own scale)")
fig.legend(fontsize=7, loc="outside right upper")
display(fig)  # not plt.show(): the report's pictures above switched pyplot to Agg
plt.close(fig)"""),
    ("md", """The Gantt charts of the two schedules (copies 0 and 1 of each; the others repeat
them on other PEs): the plain kernel's four-node chain, and the compiled body's two loads
feeding eight maccs that issue one cycle apart."""),
    ("code", """for name, r in runs.items():
    data = result_data(r)
    data["schedule"] = [row for row in data["schedule"] if row["copy"] < 2]
    show(gantt(data, OUT / f"gantt_gemm_{name}.png", iterations=2))"""),
    ("md", """Both runs on one roofline: the same MACs and the same DRAM bytes (the same
operational intensity), so the compiled point sits straight above the plain one, much closer to
the compute roof (`layer_roofline`, the per-layer roofline of a model result, draws the two)."""),
    ("code", """both = {"model": {"model": "GEMM 128^3", "arch": spec.name,
                  "layers": [{"name": name, "kind": "gemm", "macs": r.macs, "cycles": r.cycles,
                              "dram_bytes": r.dram_bytes} for name, r in runs.items()]},
        "roofline": {"peak_macs_per_cycle": spec.pe_array.num_pes * spec.pe_array.simd_lanes,
                     "dram_bytes_per_cycle": spec.dram.bytes_per_cycle}}
show(layer_roofline(both, OUT / "roofline_gemm.png"))
for name, r in runs.items():
    print(f"{name:8} {r.macs / r.dram_bytes:.2f} MACs per DRAM byte, {r.macs / r.cycles:6.1f} "
          f"MACs a cycle, {r.fraction_of_roofline:.0%} of the roofline ({r.roofline})")"""),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.cells = [new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in CELLS]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    nb.metadata["language_info"] = {"name": "python"}
    return nb


if __name__ == "__main__":
    path = Path(__file__).with_name("05_architecture.ipynb")
    nbformat.write(build(), path)
    print(f"wrote {path}")
