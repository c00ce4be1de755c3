"""The legality verifier every `Mapping` passes (docs/architecture.md#mapper)."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise

from dataflow.dfg.graph import BufferRole
from dataflow.mapper.mapping import KernelMapping, Mapping, MappingError, SystolicMapping
from dataflow.mapper.schedule import is_immediate, value_flits


def check_kernel_mapping(km: KernelMapping, arch) -> None:
    """Raise MappingError naming the violated resource, or return None."""
    where = f"kernel {km.kernel.name!r}"
    _check_issue_slots(km, arch, where)
    # dependencies and routes; a value crosses a link in ceil(words / link_width_words) flits
    flits = value_flits(km.kernel, arch)
    link_use = _check_routes(km, arch, where, flits)
    _check_link_capacity(link_use, arch, where)
    _check_registers(km, arch, where, flits)
    _check_spm(km, arch, where)


def _check_issue_slots(km: KernelMapping, arch, where: str) -> None:
    """Every placement on the array, at most `pe_array.issue_width` ops per (PE, slot), each on
    a functional unit free for its issue interval (so never two ops of one slot on one unit;
    docs/architecture.md#issue-width), every node of every copy placed, instruction entries
    within the PE's."""
    k, ii = km.kernel, km.ii
    rows, cols = arch.pe_array.rows, arch.pe_array.cols
    width = arch.pe_array.issue_width
    slots: dict = {}
    fu_busy: dict = {}
    entries = Counter()
    for p in km.placements:
        if not (len(p.pe) == 2 and 0 <= p.pe[0] < rows and 0 <= p.pe[1] < cols):
            raise MappingError(f"{where}: node %{p.node} placed on PE {p.pe} outside the array")
        held = slots.setdefault((p.pe, p.time % ii), [])
        if len(held) >= width:
            ops = "two ops" if width == 1 else f"{width + 1} ops"
            raise MappingError(f"{where}: PE {p.pe} slot {p.time % ii} holds {ops}: "
                               f"{', '.join(map(str, held))} and {(p.copy, p.node)} "
                               f"(pe_array.issue_width = {width})")
        held.append((p.copy, p.node))
        entries[p.pe] += 1
        _occupy_unit(p, arch.fu_for(k.nodes[p.node].op.value), ii, fu_busy, where)
    expected = {(c, n.id) for c in range(km.copies) for n in k.nodes}
    if set(km.placement_map) != expected:
        raise MappingError(f"{where}: not every node of every copy is placed")
    for pe, n in entries.items():
        if n > arch.pe_array.instruction_entries:
            raise MappingError(f"{where}: PE {pe} holds {n} instructions, more than "
                               "pe_array.instruction_entries = "
                               f"{arch.pe_array.instruction_entries}")


def _occupy_unit(p, fu, ii: int, fu_busy: dict, where: str) -> None:
    """Mark `fu` of p's PE busy in its slots; a functional unit of issue interval k is busy k
    consecutive slots."""
    if fu.issue_interval_cycles > ii:
        raise MappingError(f"{where}: unit {fu.name!r} issues once every "
                           f"{fu.issue_interval_cycles} cycles, more than II = {ii}")
    for j in range(fu.issue_interval_cycles):
        fkey = (p.pe, fu.name, (p.time + j) % ii)
        if fkey in fu_busy:
            raise MappingError(f"{where}: unit {fu.name!r} of PE {p.pe} is busy in slot "
                               f"{fkey[2]} with {fu_busy[fkey]} when {(p.copy, p.node)} "
                               f"issues (issue_interval_cycles = {fu.issue_interval_cycles})")
        fu_busy[fkey] = (p.copy, p.node)


def _check_routes(km: KernelMapping, arch, where: str, flits) -> dict:
    """Every route joins its PEs, leaves after and arrives before; every edge is routed.
    Returns (link, slot) -> Counter of the (copy, src, dst) routes crossing it."""
    k, ii = km.kernel, km.ii
    hop = arch.interconnect.hop_latency_cycles
    link_use: dict = {}
    routed = set()
    for r in km.routes:
        src = km.placement_map[(r.copy, r.src)]
        dst = km.placement_map[(r.copy, r.dst)]
        _check_route_path(r, src, dst, k, where)
        if r.depart < src.time + src.latency:
            raise MappingError(f"{where}: value %{r.src} leaves before it is computed")
        fl = flits[r.src]
        if r.depart + len(r.links) * hop + (fl - 1 if r.links else 0) > dst.time:
            raise MappingError(f"{where}: value %{r.src} arrives after %{r.dst} starts")
        for h, link in enumerate(r.links):
            for j in range(fl):
                key = (link, (r.depart + h * hop + j) % ii)
                link_use.setdefault(key, Counter())[(r.copy, r.src, r.dst)] += 1
        routed.add((r.copy, r.src, r.dst))
    for n in k.nodes:
        for i in n.inputs:
            for c in range(km.copies):
                if (c, i, n.id) not in routed:
                    raise MappingError(f"{where}: edge %{i}->%{n.id} of copy {c} is not routed")
    return link_use


def _check_route_path(r, src, dst, k, where: str) -> None:
    if r.links:
        if r.links[0][0] != src.pe or r.links[-1][1] != dst.pe:
            raise MappingError(f"{where}: route %{r.src}->%{r.dst} does not join its PEs")
        for a, b in pairwise(r.links):
            if a[1] != b[0]:
                raise MappingError(f"{where}: route %{r.src}->%{r.dst} is not contiguous")
    elif src.pe != dst.pe and not is_immediate(k, r.src):
        raise MappingError(f"{where}: value %{r.src}->%{r.dst} crosses PEs without a route")


def _check_link_capacity(link_use: dict, arch, where: str) -> None:
    cap = arch.interconnect.links_per_direction
    for (link, slot), use in link_use.items():
        # one value multicast to several consumers rides the link once; a repeated route is
        # another transmission
        n = len({(c, s) for c, s, _ in use}) + sum(v - 1 for v in use.values())
        if n > cap:
            raise MappingError(f"{where}: link {link} carries {n} values in slot {slot}, "
                               f"capacity interconnect.links_per_direction = {cap}")


def _check_registers(km: KernelMapping, arch, where: str, flits) -> None:
    """A value lives on its producer PE from result until its last route departs, and on the
    consumer PE from arrival until use; each live value holds one register per overlapping
    iteration (ceil(lifetime / II))."""
    k, ii = km.kernel, km.ii
    hop = arch.interconnect.hop_latency_cycles
    regs = Counter()
    for r in km.routes:
        if is_immediate(k, r.src):
            continue  # an immediate operand lives in the instruction word
        src = km.placement_map[(r.copy, r.src)]
        dst = km.placement_map[(r.copy, r.dst)]
        fl = flits[r.src]
        arrive = r.depart + len(r.links) * hop + (fl - 1 if r.links else 0)
        regs[dst.pe] += max(1, -(-(dst.time - arrive + 1) // ii))
        held = r.depart - (src.time + src.latency)  # waiting on the producer for a free link
        if held > 0 and r.links:
            regs[src.pe] += -(-held // ii)
    for pe, n in regs.items():
        if n > arch.pe_array.register_file_entries:
            raise MappingError(f"{where}: PE {pe} needs {n} registers, more than "
                               "pe_array.register_file_entries = "
                               f"{arch.pe_array.register_file_entries}")


def _check_spm(km: KernelMapping, arch, where: str) -> None:
    """SPM buffers disjoint and within capacity; every tile's window within its allocation."""
    spans = []
    for a in km.allocations:
        spans.append((a.base, a.base + a.words, a.buffer))
        if a.base_alt is not None:
            spans.append((a.base_alt, a.base_alt + a.words, a.buffer))
    spans.sort()
    for (_a0, a1, an), (b0, _b1, bn) in pairwise(spans):
        if b0 < a1:
            raise MappingError(f"{where}: SPM buffers {an!r} and {bn!r} overlap")
    if spans and spans[-1][1] > arch.spm.capacity_words:
        raise MappingError(f"{where}: SPM allocation ends at word {spans[-1][1]}, "
                           f"capacity {arch.spm.capacity_words}")
    for t in km.tiles:
        for name, lo, hi in t.windows:
            if hi - lo > km.allocation_map[name].words:
                raise MappingError(f"{where}: tile [{t.lo},{t.hi}) window of {name!r} "
                                   f"({hi - lo} words) exceeds its allocation")


def check_on_chip(mapping: Mapping) -> None:
    """Every buffer handed over in the SPM (read with `fetch="on_chip"`) sits whole at the same
    words in the kernel that leaves it (its writer, or a reader with "keep") and the kernel
    that reads it, and no kernel in between allocates over them
    (docs/conventions.md#moe-buffers-handed-over-in-the-spm)."""
    kms = [km for km in mapping.kernels if not isinstance(km, SystolicMapping)]
    left: dict[str, int] = {}  # buffer -> index in kms of the kernel that left it on chip
    for j, km in enumerate(kms):
        for b in km.kernel.buffers:
            if not b.on_chip or b.role != BufferRole.INPUT:
                continue
            if b.name not in left:
                raise MappingError(f"kernel {km.kernel.name!r} reads {b.name!r} on chip, but "
                                   "no kernel before it leaves it there")
            i = left[b.name]
            made, read = kms[i].allocation_map[b.name], km.allocation_map[b.name]
            where = f"buffer {b.name!r} handed from {kms[i].kernel.name!r} to {km.kernel.name!r}"
            if made.streamed or read.streamed or (made.base, made.words) != (read.base,
                                                                            read.words):
                raise MappingError(f"{where}: held at words [{made.base}, "
                                   f"{made.base + made.words}) and read at [{read.base}, "
                                   f"{read.base + read.words}); both must hold it whole there")
            for mid in kms[i + 1:j]:
                for a in mid.allocations:
                    for lo in (a.base, a.base_alt):
                        if lo is not None and lo < made.base + made.words \
                                and made.base < lo + a.words:
                            raise MappingError(f"{where}: kernel {mid.kernel.name!r} between "
                                               f"them allocates {a.buffer!r} over it")
        for b in km.kernel.buffers:
            if b.role == BufferRole.OUTPUT and not b.on_chip:
                left.pop(b.name, None)
            elif b.held:  # left on chip by its writer, or kept after its load
                left[b.name] = j


def check_mapping(mapping: Mapping) -> None:
    check_on_chip(mapping)
    for km in mapping.kernels:
        if isinstance(km, SystolicMapping):
            if (km.rows, km.cols) != (mapping.arch.pe_array.rows, mapping.arch.pe_array.cols):
                raise MappingError(f"kernel {km.kernel.name!r}: systolic mapping for "
                                   f"{km.rows}x{km.cols} on a different array")
            if km.dataflow not in ("os", "ws", "is"):
                raise MappingError(f"unknown systolic dataflow {km.dataflow!r}")
            continue
        check_kernel_mapping(km, mapping.arch)
