"""The area model (`area_breakdown`): mm² by component from the arch's area table. Its own
module, importing nothing but the arch, so the numpy-free timing path
(dataflow/pe_array/systolic_timing.py, docs/conventions.md#timing-only) shares it with
`pe_array.simulate`, which re-exports it."""

from __future__ import annotations


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
