"""`assemble_result`, the one place a `SimResult` is put together, the area model
(`area_breakdown`) it fills in and the energy model (`energy_breakdown`) its callers give it.
Their own module, importing no numpy, so the numpy-free timing path
(dataflow/pe_array/systolic_timing.py, docs/conventions.md#timing-only) shares them with
`pe_array.simulate`, which re-exports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataflow.arch.spec import PEKind
from dataflow.dfg.ops import Op
from dataflow.pe_array.result import ArrayResult, SimResult

if TYPE_CHECKING:
    import numpy as np


def energy_breakdown(arrays: list[ArrayResult], arch, dram_bytes: int,
                     kernels: int) -> dict[str, float]:
    """pJ by component from action counts and the arch's energy table (cited in its YAML)."""
    e = arch.energy
    compute = 0.0
    for a in arrays:
        for name, count in a.op_counts:
            op = Op(name)
            if op.multiplies:
                compute += count * e.mac_pj
            elif op in (Op.EXP, Op.DIV):
                compute += count * e.sfu_pj
            elif op is Op.VSUM:  # lanes - 1 adds of the reduction tree
                compute += count * e.alu_pj * (arch.pe_array.simd_lanes - 1)
            elif not op.is_memory:  # memory ops are charged as SPM accesses below
                compute += count * e.alu_pj
    row_bits = arch.spm.words_per_row * arch.word_bytes * 8
    accesses = sum(int(a.spm_reads_per_line.sum() + a.spm_writes_per_line.sum()) for a in arrays)
    if arch.pe_array.kind == PEKind.SYSTOLIC:  # counted in words, not rows
        row_bits = arch.word_bytes * 8
    return {
        "compute": compute,
        "spm": accesses * e.spm_access_pj * row_bits / 64.0,  # Horowitz figures are per 64 bits
        "dram": dram_bytes * e.dram_byte_pj,
        "interconnect": sum(a.link_word_hops for a in arrays) * e.link_hop_pj,
        "reconfiguration": kernels * arch.pe_array.num_pes * e.reconfiguration_pj,
    }


def area_breakdown(arch) -> dict[str, float]:
    """mm² by component from the arch's area table: PEs; SPM lines (per line, scaled by ports
    beyond one read and one write port: each extra port adds its bit lines, our stated
    first-order assumption); routers, whose crossbar grows with the links they join (4 mesh
    directions, 4 more per skip-hop stride, times links_per_direction)."""
    a, pe, spm, ic = arch.area, arch.pe_array, arch.spm, arch.interconnect
    ports = spm.read_ports_per_line + spm.write_ports_per_line
    directions = 4 * (1 + len(ic.skip_hop_strides)) * ic.links_per_direction
    return {
        "pe_array": pe.num_pes * a.pe_mm2,
        "spm": spm.lines * a.spm_line_mm2 * ports / 2,
        "interconnect": pe.num_pes * a.router_mm2 * directions / 4,
    }


def assemble_result(arch, *, workload: str, engine: str, counts: dict[str, np.ndarray],
                    energy_pj: dict[str, float], **fields) -> SimResult:
    """The one place a `SimResult` is put together (the engine's run, butterfly residencies,
    experts side by side): what follows from the architecture -- its name and clock, the peak
    MACs per cycle, the area breakdown, the DRAM peak for rooflines -- is filled in here; the
    caller gives the timing, traffic and values (`fields`, SimResult's own names), `counts`
    (`array_counts`) and the energy by component in pJ."""
    return SimResult(
        workload=workload, arch=arch.name, clock_ghz=arch.clock_ghz, engine=engine,
        peak_macs_per_cycle=arch.pe_array.num_pes * arch.pe_array.simd_lanes,
        area_mm2=tuple(area_breakdown(arch).items()),
        dram_bytes_per_cycle=arch.dram.bytes_per_cycle,
        issue_width=arch.pe_array.issue_width,
        energy_pj=tuple(energy_pj.items()), **counts, **fields)
