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
from the real address streams, the address-to-line policy, link capacity and width, hop latency.
Pictures come from `dataflow.report` (the same ones `dataflow report RESULT` writes)."""),
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
