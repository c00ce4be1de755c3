"""Lower bounds on a kernel's initiation interval and the copy counts they admit: MII =
max(ResMII, RecMII) (Rau, "Iterative Modulo Scheduling", 1994). ResMII from PE issue slots
(`pe_array.issue_width` a cycle, docs/architecture.md#issue-width), functional-unit occupancy
and SPM row ports; RecMII from loop-carried cycles. The modulo scheduler (`schedule.py`) starts
from them, and the compiler (`dataflow/plan/`) sizes its candidates with them.
"""

from __future__ import annotations

import math
from collections import Counter

from dataflow.arch.spec import ArchSpec
from dataflow.dfg.graph import Kernel
from dataflow.dfg.ops import Op

# Deferred imports: networkx is imported in `rec_mii`, its one user (start-up).

__all__ = ["ii1_copies", "issue_copies", "op_latency", "rec_mii", "res_mii", "unit_busy"]


def op_latency(arch: ArchSpec, op: Op) -> int:
    """Cycles from issue to result: the FU's latency, plus the SPM access for loads."""
    lat = arch.op_latency(op.value)
    # acc-like ops combine into the PE's register: their SPM read-modify-write is off the
    # recurrence, so only plain loads and gathers wait for the SPM
    if op.reads_spm and not op.accumulates:
        lat += arch.spm.access_latency_cycles
    return lat


def res_mii(kernel: Kernel, arch: ArchSpec, copies: int) -> int:
    """Resource-constrained MII: PE issue slots, FU occupancy, SPM row ports."""
    pes = arch.pe_array.num_pes
    # issue_width issues per PE per cycle (docs/architecture.md#issue-width)
    bound = math.ceil(copies * len(kernel.nodes) / (pes * arch.pe_array.issue_width))
    for n in kernel.nodes:  # the FU must be free again next II
        bound = max(bound, arch.fu_for(n.op.value).issue_interval_cycles)
    for cycles in unit_busy(kernel, arch).values():
        bound = max(bound, math.ceil(copies * cycles / pes))
    # a held load reads once per run of its address (docs/conventions.md#held-loads)
    streaming = [n for n in kernel.nodes if not (_flushes_per_run(kernel, n) or n.hold)]
    reads = sum(1 for n in streaming if n.op.reads_spm)
    writes = sum(1 for n in streaming if n.op.writes_spm)
    spm = arch.spm
    bound = max(bound, math.ceil(copies * reads / (spm.lines * spm.read_ports_per_line)))
    bound = max(bound, math.ceil(copies * writes / (spm.lines * spm.write_ports_per_line)))
    return max(1, bound)


def unit_busy(kernel: Kernel, arch: ArchSpec) -> Counter:
    """Slots each functional unit of a PE is busy per copy of `kernel` (its ops' issue
    intervals summed), by unit name."""
    busy = Counter()
    for n in kernel.nodes:
        fu = arch.fu_for(n.op.value)
        busy[fu.name] += fu.issue_interval_cycles
    return busy


def issue_copies(kernel: Kernel, arch: ArchSpec) -> int:
    """The most copies of `kernel` the PEs can issue at II = 1 (`ii1_copies` of its nodes and
    units)."""
    return ii1_copies(len(kernel.nodes), tuple(unit_busy(kernel, arch).values()), arch)


def ii1_copies(nodes: int, units: tuple[int, ...], arch: ArchSpec) -> int:
    """Copies of a body of `nodes` nodes whose units are busy `units` slots per copy that the
    PEs issue at II = 1 (0: not one): PEs // nodes on a single-issue PE; with `issue_width` > 1
    PEs x width // nodes, and no more than each unit admits (docs/architecture.md#issue-width).
    The compiler's GEMM model asks it of bodies it has not built (`gemm_schedule`)."""
    pes, width = arch.pe_array.num_pes, arch.pe_array.issue_width
    if width == 1:
        return pes // nodes
    return min([pes * width // nodes] + [pes // u for u in units if u])


def _flushes_per_run(kernel: Kernel, node) -> bool:
    """An accumulation whose address does not move with the innermost loop touches the SPM
    once per run of that loop (its register flush), not every iteration, so it takes no SPM
    port slot in the steady state (docs/conventions.md#accumulation-flushing)."""
    inner = kernel.loops[-1].var
    return (node.op.accumulates and not node.op.is_indirect and node.addr.coef(inner) == 0
            and inner != kernel.vector_var)


def rec_mii(kernel: Kernel, arch: ArchSpec) -> int:
    """Recurrence-constrained MII: max over dependence cycles of ceil(latency / distance). An
    accumulating op's own recurrence is its register's one-cycle combine (a macc's multiplier
    is pipelined ahead of it: docs/conventions.md#register-blocking)."""
    if not any(dist for _, _, dist in kernel.carried):
        return 1  # every edge has distance 0, so no cycle counts (and enumerating them is slow)
    import networkx as nx

    g = kernel.graph()
    best = 1
    for cycle in nx.simple_cycles(g):
        lat = dist = 0
        for a, b in zip(cycle, cycle[1:] + cycle[:1]):
            op = kernel.nodes[a].op
            lat += 1 if op.accumulates and len(cycle) == 1 else op_latency(arch, op)
            dist += g.edges[a, b]["distance"]
        if dist:
            best = max(best, math.ceil(lat / dist))
    return best
