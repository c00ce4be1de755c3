"""Line-aware order of a static sparse operand's nonzeros (docs/conventions.md#gather-lines).

A gather `B[crd[p]]` hits the SPM line of the row its index picks, so its line is a value; but
when the index array is a program input (a CSR operand's columns) the values are known when
the kernel is planned, and so is the cycle at which every iteration issues (the modulo
schedule, the copies' chunks and delays, `pe_array/fast.py:_waves`). Within one row of the
sparse loop (`p` over `pos[i] .. pos[i + 1]`) the nonzeros may run in any order: the
iteration at slot s reads whatever the operand's arrays hold at s, and the row's sum changes
only by the order of its additions (fp32 rounding; `dataflow.testing.values_match`).

`line_order` walks the iterations of each tile in issue order and gives each slot the
not-yet-placed nonzero of its row whose gathered rows land on the least loaded lines of their
cycles, counting reads per (cycle, line) as the engine does (`spm/lines.py:port_cycles`): the
static reads (the value and index loads, dense operands) first, then each gather as it is
placed. The operand's arrays are permuted by the order found (`apply_order`), every buffer
the sparse loop indexes the same way, so the program computes the same sums.

It applies to a kernel whose every access through the sparse loop's variable is a load of a
program input at exactly that position, and whose gathers all take their index from one such
load; a kernel that writes through the position (an SDDMM's output) or a buffer another kernel
reads is left as it is (`orderable`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import pickle
import sys

import numpy as np

from dataflow.arch.load import arch_to_dict
from dataflow.arch.spec import ArchSpec
from dataflow.cachefiles import read_entry, resolve_cache_dir, write_entry
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import Kernel, Program, vector_nodes
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping, Mapping
from dataflow.pe_array.common import spm_base
from dataflow.plan.gather_greedy import _runner
from dataflow.spm.lines import line_of_row, port_cycles

#: (rounds of swaps within rows after the greedy placement, slots of its row a stalled
#: iteration tries to swap with: the next ones, round the row), when a candidate schedule's
#: first tile is measured and when the chosen one is ordered for the run
MEASURE_SWAPS = (1, 8)
RUN_SWAPS = (2, 12)

ORDER_NOTE = "nonzeros of each row ordered by the line-aware gather table"


@dataclasses.dataclass(frozen=True)
class _Orderable:
    """What `line_order` permutes in one kernel: the sparse loop variable, its pos array, the
    buffers it indexes (program inputs read at exactly the position), the buffer holding the
    gathers' index, and the program outputs written at exactly the position (read back in the
    nonzeros' order, `Program.output_order`)."""

    var: str
    pos: str
    buffers: tuple[str, ...]
    index: str
    outputs: tuple[str, ...] = ()
    # u > 1: the loop runs over rows padded to multiples of u, u nonzeros an iteration, each
    # position load a row of u words and each gather taking its lane's index
    # (docs/conventions.md#nonzero-unroll)
    unroll: int = 1


def _at_position(n, var: str) -> bool:
    return (n.addr.terms == ((var, 1),) and not n.addr.const and not n.addr.span
            and not n.addr.index_stride)


def _unrolled_width(kernel: Kernel, var: str) -> int:
    """u when every access that moves with `var` is a load of the row of u words at u * var
    and every gather takes a lane of its index, the same number per lane
    (docs/conventions.md#nonzero-unroll); 1 otherwise."""
    moving = [n for n in kernel.nodes if n.addr is not None and n.addr.coef(var)]
    spans = {n.addr.span for n in moving}
    if len(spans) != 1 or (u := spans.pop()) < 2 or any(
            n.op is not Op.LOAD or n.addr.terms != ((var, u),) or n.addr.const
            for n in moving):
        return 1
    lanes = [n.lane for n in kernel.nodes if n.op is Op.GATHER]
    if any(lane is None for lane in lanes) or \
            len({lanes.count(lane) for lane in range(u)}) != 1 or len(lanes) % u:
        return 1
    return u


def orderable(kernel: Kernel, program: Program) -> _Orderable | None:
    """The sparse loop of `kernel` (one of `program`'s, perhaps transformed) whose nonzeros
    may be reordered, or None (see the module docstring)."""
    sparse = [lp for lp in kernel.loops if not lp.is_dense]
    if len(sparse) != 1:
        return None
    var, inputs = sparse[0].var, program.input_map
    outputs = {name for name, _ in program.outputs}
    unroll = _unrolled_width(kernel, var)
    bufs, idx, outs = set(), set(), set()
    gathers = [n for n in kernel.nodes if n.addr is not None and n.addr.index_stride]
    if not gathers or len({g.addr.index_stride for g in gathers}) != 1:
        return None
    for n in kernel.nodes:
        if n.addr is None or not n.addr.coef(var):
            continue
        if n.op is Op.LOAD and n.buffer in inputs and (_at_position(n, var) or unroll > 1):
            bufs.add(n.buffer)
        elif n.op.writes_spm and n.buffer in outputs and _at_position(n, var) \
                and n.op in (Op.STORE, Op.ACC, Op.MACC):
            outs.add(n.buffer)
        else:
            return None
    for g in gathers:
        src = kernel.nodes[g.inputs[0]]
        if src.op is not Op.LOAD or src.buffer not in bufs or g.addr.coef(var) \
                or g.op is not Op.GATHER:
            return None
        idx.add(src.buffer)
    if len(idx) != 1:
        return None
    # another kernel reading or writing them would see the order
    if any(k.name != kernel.name and any(n.buffer in bufs | outs for n in k.nodes)
           for k in program.kernels):
        return None
    # an output written at the position is read there by nothing else of this kernel
    if any(n.buffer in outs and n.op.reads_spm and not n.op.accumulates for n in kernel.nodes):
        return None
    size = len(inputs[next(iter(idx))])
    if any(math.prod(shape) != size for name, shape in program.outputs if name in outs):
        return None
    if unroll > 1 and outs:
        return None
    return _Orderable(var, sparse[0].pos, tuple(sorted(bufs)), idx.pop(), tuple(sorted(outs)),
                      unroll)


def _static_rows(km: KernelMapping, arch: ArchSpec, dom, n: int, copy, cyc_of, ti: int,
                 tile) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(cycle, SPM row, is a write) of every row access of the affine nodes in one tile, as
    the engine issues them: loads and stores every iteration, an accumulation (a read and a
    write) at its flushes (the last iteration of a run of one address on one copy,
    `fast._flushes`)."""
    kernel, spm = km.kernel, arch.spm
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    vec = vector_nodes(kernel)
    cs, rs, ws = [], [], []
    for node in kernel.nodes:
        if not node.op.is_memory or node.addr.index_stride:
            continue
        base, first = spm_base(km, node.buffer, ti, tile)
        a = np.full(n, node.addr.const, dtype=np.int64)
        for v, c in node.addr.terms:
            if v != kernel.vector_var or node.addr.span:
                a = a + c * dom[v]
        if node.id in vec and not node.addr.span:
            a = a + dom[kernel.vector_var] * node.addr.coef(kernel.vector_var)
        sel = np.arange(n)
        if node.op.accumulates:
            flush = np.ones(n, dtype=bool)
            flush[:-1] = (a[1:] != a[:-1]) | (copy[1:] != copy[:-1])
            sel = np.flatnonzero(flush)
        elif node.hold:  # read where its address changes (docs/conventions.md#held-loads)
            again = np.ones(n, dtype=bool)
            again[1:] = (a[1:] != a[:-1]) | (copy[1:] != copy[:-1])
            sel = np.flatnonzero(again)
        if node.id in vec:
            width = node.addr.span or lanes
            cv = 1 if node.addr.span else node.addr.coef(kernel.vector_var)
            words = a[sel, None] + cv * np.arange(width)[None, :]
        else:
            words = a[sel, None]
        rows = (words - first + base) // spm.words_per_row
        keep = np.ones(rows.shape, dtype=bool)  # an access's distinct rows (lanes ascend)
        keep[:, 1:] = rows[:, 1:] != rows[:, :-1]
        cyc = np.broadcast_to(cyc_of(node.id)[sel, None], rows.shape)[keep]
        for flag in (False, True):  # an accumulation's flush reads and writes
            if (node.op.writes_spm if flag else node.op.reads_spm):
                cs.append(cyc)
                rs.append(rows[keep])
                ws.append(np.full(len(cyc), flag))
    if not cs:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool)
    return np.concatenate(cs), np.concatenate(rs), np.concatenate(ws)


def _per_line(cyc: np.ndarray, row: np.ndarray, n_cycles: int, spm,
              distinct: bool) -> np.ndarray:
    """Accesses per (cycle, line); `distinct`: reads of one row in one cycle count once."""
    out = np.zeros((n_cycles, spm.lines), dtype=np.int64)
    if len(cyc):
        if distinct:
            span = int(row.max()) + 1
            keys = np.unique(cyc * span + row)
            cyc, row = keys // span, keys % span
        np.add.at(out, (cyc, line_of_row(row, spm)), 1)
    return out


def _tile_order(km: KernelMapping, arch: ArchSpec, o: _Orderable, crd: np.ndarray, ti: int,
                tile, perm: np.ndarray, used: np.ndarray, swaps: tuple[int, int]) -> int:
    """`line_order` on tile `ti`: fills `perm` for the positions the tile runs; returns the
    SPM conflict stalls the tile will have, as the engine counts them but for two gathers of
    one row in one cycle, counted twice (the engine's line broadcasts the row): a bound."""
    kernel, spm = km.kernel, arch.spm
    lanes = arch.pe_array.simd_lanes if kernel.vector_var else 1
    dom = enumerate_domain(kernel, lanes, (tile.lo, tile.hi))
    n = len(dom[kernel.loops[0].var])
    if n == 0:
        return 0
    waves = -(-n // km.copies)
    k = np.arange(n, dtype=np.int64)
    copy, wave = k // waves, k % waves
    times = np.zeros((km.copies, len(kernel.nodes)), dtype=np.int64)
    for p in km.placements:
        times[p.copy, p.node] = p.time

    def cyc_of(node_id):
        return wave * km.ii + times[copy, node_id]

    gathers = [nd for nd in kernel.nodes if nd.addr is not None and nd.addr.index_stride]
    stride = gathers[0].addr.index_stride
    vec = vector_nodes(kernel)
    n_cycles = (waves - 1) * km.ii + km.schedule_length
    sc, sr, sw = _static_rows(km, arch, dom, n, copy, cyc_of, ti, tile)
    cnt = _per_line(sc[~sw], sr[~sw], n_cycles, spm, True)
    wcnt = _per_line(sc[sw], sr[sw], n_cycles, spm, False)
    gcyc = np.stack([cyc_of(g.id) for g in gathers], axis=1)
    goff = np.zeros((n, len(gathers)), dtype=np.int64)
    gwidth = np.ones(len(gathers), dtype=np.int64)
    gstride = np.zeros(len(gathers), dtype=np.int64)
    for j, g in enumerate(gathers):
        base, first = spm_base(km, g.buffer, ti, tile)
        a = np.full(n, g.addr.const + base - first, dtype=np.int64)
        for v, c in g.addr.terms:
            if v != kernel.vector_var or g.addr.span:
                a = a + c * dom[v]
        if g.id in vec:
            gwidth[j] = g.addr.span or lanes
            gstride[j] = 1 if g.addr.span else g.addr.coef(kernel.vector_var)
            if not g.addr.span:
                a = a + dom[kernel.vector_var] * gstride[j]
        goff[:, j] = a
    slot = dom[o.var]
    parent = dom[next(lp.parent for lp in kernel.loops if lp.var == o.var)]
    pos = kernel.domain[o.pos] * o.unroll
    if o.unroll > 1:  # each (iteration, lane) placed as an iteration of its lane's gathers
        gcyc, goff, gwidth, gstride, slot, parent, copy = _per_lane(
            o.unroll, gathers, gcyc, goff, gwidth, gstride, slot, parent, copy)
        n = len(slot)
        k = np.arange(n, dtype=np.int64)
    order_g = np.argsort(gcyc, axis=1, kind="stable")  # an iteration's gathers by cycle
    gcyc = np.take_along_axis(gcyc, order_g, axis=1)
    goff = np.take_along_axis(goff, order_g, axis=1)
    gwidth, gstride = gwidth[order_g[0]], gstride[order_g[0]]
    lo = np.zeros(len(crd), dtype=np.int64)
    hi = np.zeros(len(crd), dtype=np.int64)
    lo[slot], hi[slot] = pos[parent], pos[parent + 1]
    # runs of consecutive iterations reading one slot (loops inside the sparse one)
    head = np.ones(n, dtype=bool)
    head[1:] = slot[1:] != slot[:-1]
    nxt = np.where(np.append(~head[1:], False), k + 1, -1)
    # the first iteration of the one run that reads each slot; -1 when none or several (a
    # row run twice: its order is the first run's, and no swap moves it)
    k_of = np.full(len(crd), -1, dtype=np.int64)
    seen = np.bincount(slot[head], minlength=len(crd))
    once = head & (seen[slot] == 1)
    k_of[slot[once]] = k[once]
    order = np.lexsort((copy, gcyc[:, 0]))
    top = int(goff.max()) + stride * int(crd.max()) + int(((gwidth - 1) * gstride).max()) + 1
    lut = np.asarray(line_of_row(np.arange(top // spm.words_per_row + 1, dtype=np.int64), spm),
                     dtype=np.int64)
    work = n * int((hi[slot] - lo[slot]).max())
    _runner(work)(order, slot, lo, hi, k_of, crd.astype(np.int64), gcyc, goff, gwidth, gstride,
           stride, spm.words_per_row, lut, cnt, wcnt, spm.read_ports_per_line,
           spm.write_ports_per_line, perm, used, nxt, head, *swaps)
    return int((port_cycles(cnt, wcnt, spm).max(axis=1) - 1).sum())


def _per_lane(u: int, gathers, gcyc, goff, gwidth, gstride, slot, parent, copy) -> tuple:
    """An unrolled kernel's iterations split by lane (docs/conventions.md#nonzero-unroll):
    iteration k's lane l becomes row k * u + l, with lane l's gathers (cycles, offsets,
    widths, strides), its slot u * slot + l, its parent and its copy."""
    cols = np.array([[j for j, g in enumerate(gathers) if g.lane == lane]
                     for lane in range(u)])
    n = gcyc.shape[0]
    lanes = np.tile(np.arange(u, dtype=np.int64), n)
    return (gcyc[:, cols].reshape(n * u, -1), goff[:, cols].reshape(n * u, -1),
            gwidth[cols[0]], gstride[cols[0]], np.repeat(slot, u) * u + lanes,
            np.repeat(parent, u), np.repeat(copy, u))


def _permutation(km: KernelMapping, arch: ArchSpec, o: _Orderable,
                 inputs: dict[str, np.ndarray],
                 swaps: tuple[int, int] = MEASURE_SWAPS) -> tuple[np.ndarray, int]:
    """(position -> the nonzero it holds in the line-aware order over `km`'s tiles, the SPM
    conflict stalls the table counts for that order)."""
    crd = np.asarray(inputs[o.index]).astype(np.int64)
    perm = np.full(len(crd), -1, dtype=np.int64)
    used = np.zeros(len(crd), dtype=bool)
    stalls = sum(_tile_order(km, arch, o, crd, ti, tile, perm, used, swaps)
                 for ti, tile in enumerate(km.tiles))
    free = perm < 0
    perm[free] = np.flatnonzero(free)
    return perm, stalls


def _ordered(km: KernelMapping, arch: ArchSpec, program: Program,
             swaps: tuple[int, int]) -> tuple[dict[str, np.ndarray], _Orderable | None,
                                               np.ndarray | None]:
    """(`program`'s inputs with `km`'s nonzeros in the line-aware order, what was ordered,
    the order: position -> the nonzero it holds); the inputs as they are when `km` is not
    orderable."""
    o = orderable(km.kernel, program)
    if o is None:
        return program.input_map, None, None
    inputs = dict(program.input_map)
    perm, _ = _permutation(km, arch, o, inputs, swaps)
    for b in o.buffers:
        inputs[b] = np.asarray(inputs[b])[perm]
    return inputs, o, perm


def ordered_inputs(km: KernelMapping, arch: ArchSpec, program: Program,
                   swaps: tuple[int, int] = MEASURE_SWAPS) -> dict[str, np.ndarray]:
    """`program`'s inputs with `km`'s nonzeros in the line-aware order over `km`'s tiles (the
    first tile only, for a measurement of it), or as they are when `km` is not orderable."""
    return _ordered(km, arch, program, swaps)[0]


def _sparse_var(kernel: Kernel) -> tuple[str, str] | None:
    sparse = [lp for lp in kernel.loops if not lp.is_dense]
    return (sparse[0].var, sparse[0].pos) if len(sparse) == 1 else None


def shared_order(program: Program) -> tuple[tuple[str, ...], tuple[str, ...],
                                            dict[str, _Orderable]] | None:
    """A sparse operand read by several kernels (attention's mask: the scores, the softmax and
    the PV product), each running one sparse loop over the same pos array and touching every
    buffer indexed by the position at exactly the position, so that one order of the
    nonzeros serves them all: (the program inputs to permute, the program outputs written at
    the positions, {kernel name: what its gathers need}) or None."""
    at_pos: set[str] = set()
    pos_array = None
    for k in program.kernels:
        sv = _sparse_var(k)
        for n in k.nodes:
            if sv and n.addr is not None and n.addr.coef(sv[0]):
                at_pos.add(n.buffer)
    if not at_pos:
        return None
    gathering: dict[str, _Orderable] = {}
    inputs = program.input_map
    for k in program.kernels:
        touching = [n for n in k.nodes if n.buffer in at_pos]
        if not touching:
            continue
        sv = _sparse_var(k)
        if sv is None:
            return None
        pos = k.domain[sv[1]]
        if pos_array is None:
            pos_array = pos
        elif not np.array_equal(pos, pos_array):
            return None
        if any(not _at_position(n, sv[0]) or n.op not in (Op.LOAD, Op.STORE, Op.ACC)
               for n in touching):
            return None
        gathers = [n for n in k.nodes if n.addr is not None and n.addr.index_stride]
        if gathers:
            srcs = {k.nodes[g.inputs[0]] for g in gathers}
            if len({g.addr.index_stride for g in gathers}) != 1 or len(srcs) != 1 \
                    or any(g.op is not Op.GATHER or g.addr.coef(sv[0]) for g in gathers):
                return None
            src = srcs.pop()
            if src.op is not Op.LOAD or src.buffer not in at_pos or src.buffer not in inputs:
                return None
            gathering[k.name] = _Orderable(sv[0], sv[1], (), src.buffer)
    permuted = tuple(sorted(b for b in at_pos if b in inputs))
    outs = tuple(sorted(name for name, _ in program.outputs if name in at_pos))
    size = int(pos_array[-1])
    if not gathering or any(len(inputs[b]) != size for b in permuted) \
            or any(math.prod(s) != size for name, s in program.outputs if name in outs):
        return None
    return permuted, outs, gathering


def _stalls_under(km: KernelMapping, arch: ArchSpec, o: _Orderable, crd: np.ndarray) -> int:
    """The SPM conflict stalls the table counts for `km` with its nonzeros as `crd` holds
    them (every slot's nonzero given)."""
    perm = np.arange(len(crd), dtype=np.int64)
    used = np.ones(len(crd), dtype=bool)
    return sum(_tile_order(km, arch, o, crd.astype(np.int64), ti, tile, perm, used, (0, 0))
               for ti, tile in enumerate(km.tiles))


def _shared_step(mapping: Mapping):
    """`line_order`'s step for a sparse operand several kernels read (`shared_order`): each
    gathering kernel's line-aware order is tried on all of them, and the one with the fewest
    stalls the table counts, over all, is kept (None: the given order has no more)."""
    program, arch = mapping.program, mapping.arch
    found = shared_order(program)
    if found is None:
        return None
    permuted, outs, gathering = found
    kms = {km.kernel.name: km for km in mapping.kernels
           if isinstance(km, KernelMapping) and km.kernel.name in gathering}
    if not kms:
        return None
    crd = np.asarray(program.input_map[next(iter(gathering.values())).index])

    def total(order: np.ndarray) -> int:
        return sum(_stalls_under(kms[name], arch, gathering[name], crd[order]) for name in kms)

    best_perm, best = None, total(np.arange(len(crd)))
    for name, km in kms.items():
        perm, _ = _permutation(km, arch, gathering[name], program.input_map, RUN_SWAPS)
        cost = total(perm)
        if cost < best:
            best_perm, best = perm, cost
    return None if best_perm is None else (permuted, outs, best_perm)


def _apply(program: Program, steps) -> Program:
    """`program` with each step's buffers permuted and its outputs' order recorded."""
    for buffers, outs, perm in steps:
        known = dict(program.output_order)
        order = tuple((b, known[b][perm] if b in known else perm) for b in outs)
        program = dataclasses.replace(
            program, inputs=tuple((name, np.asarray(x)[perm] if name in buffers else x)
                                  for name, x in program.inputs),
            output_order=(*((b, x) for b, x in program.output_order if b not in outs),
                          *order))
    return program


def _steps(mapping: Mapping) -> list:
    """The permutations `line_order` applies, in order: (buffers, outputs, order) per
    orderable kernel, else one for an operand several kernels read."""
    program, arch = mapping.program, mapping.arch
    steps = []
    for km in mapping.kernels:
        if not isinstance(km, KernelMapping):
            continue
        o = orderable(km.kernel, program)
        if o is None:
            continue
        perm, _ = _permutation(km, arch, o, program.input_map, RUN_SWAPS)
        steps.append((o.buffers, o.outputs, perm))
        program = _apply(program, steps[-1:])
    if steps:
        return steps
    shared = _shared_step(mapping)
    return [shared] if shared else []


#: orders found, per mapping's kernels and index arrays: a plan's mapping bound to the values
#: it was planned with (`Plan.bind` after `choose_schedule`) is not ordered twice
_ORDERS: dict = {}
ORDERS_KEPT = 8


def line_order(mapping: Mapping) -> Mapping:
    """`mapping` with the nonzeros of every orderable kernel's rows in the line-aware order
    (the module docstring): its kernels unchanged, its program's inputs permuted and its
    outputs written at the positions read back in the nonzeros' order
    (`Program.output_order`)."""
    digest = hashlib.sha1()
    for name, x in mapping.program.inputs:
        if np.asarray(x).dtype.kind in "iu":  # the indices: the pattern the order follows
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(x).tobytes())
    key = (tuple(id(k) for k in mapping.kernels), digest.hexdigest())
    hit = _ORDERS.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], mapping.kernels)):
        steps = hit[1]
    else:
        path, full = _orders_file(mapping, key[1])
        steps = read_entry(path, ORDERS_KIND, ORDERS_VERSION,
                           lambda payload: _valid_steps(pickle.loads(payload), full, mapping))
        if steps is None:
            steps = _steps(mapping)
            write_entry(path, ORDERS_KIND, ORDERS_VERSION, pickle.dumps(
                {"key": full, "steps": steps}, protocol=pickle.HIGHEST_PROTOCOL))
        _ORDERS[key] = (mapping.kernels, steps)
        while len(_ORDERS) > ORDERS_KEPT:
            _ORDERS.pop(next(iter(_ORDERS)))
    if not steps:
        return mapping
    return dataclasses.replace(mapping, program=_apply(mapping.program, steps))


ORDERS_KIND, ORDERS_VERSION = "line-order", 1


def _orders_file(mapping: Mapping, digest: str):
    """`<cache dir>/line_orders/<hash of the arch, the kernel mappings and the index arrays>`:
    the order depends on the schedule (each gather's issue cycle) and the pattern."""
    h = hashlib.sha256(json.dumps(arch_to_dict(mapping.arch), sort_keys=True,
                                  default=str).encode())
    with np.printoptions(threshold=sys.maxsize):  # reprs, not pickles: no set order enters
        for km in mapping.kernels:
            h.update(repr((str(km.kernel), km.copies, km.ii, km.placements, km.allocations,
                           km.tiles) if isinstance(km, KernelMapping) else km).encode())
    h.update(repr((digest, RUN_SWAPS)).encode())
    return resolve_cache_dir() / "line_orders" / f"{h.hexdigest()[:32]}.order", h.hexdigest()


def _valid_steps(got, full: str, mapping: Mapping) -> list:
    """The steps of an order file's record; ValueError unless it is `mapping`'s (its full key)
    and every permutation fits the program's arrays (a damaged file is then rebuilt)."""
    if not (isinstance(got, dict) and got.get("key") == full):
        raise ValueError("the order of another mapping")
    steps = got["steps"]
    sizes = {name: len(np.asarray(x)) for name, x in mapping.program.inputs}
    for buffers, _outs, perm in steps:
        perm = np.asarray(perm)
        if not (np.array_equal(np.sort(perm), np.arange(len(perm)))
                and all(sizes.get(b, len(perm)) == len(perm) for b in buffers)):
            raise ValueError("not a permutation of the program's nonzeros")
    return steps
