"""The fast engine: one tile at a time, vectorised over all iterations with numpy.

Same semantics as `reference.py`, which steps every cycle: the tile's n iterations are cut
into U contiguous chunks of W = ceil(n / U); iteration k runs on body copy k div W in wave
k mod W, so node n of it issues at cycle wave*II + t(copy, n). An ACC node accumulates in its
PE's register and reads-modifies-writes the SPM once per run of consecutive same-address
iterations of its copy. A held load reads the SPM only in the iterations whose address differs
from its copy's previous one (docs/conventions.md#held-loads). SPM row accesses are counted
per (cycle, line) from the real address streams; a cycle whose busiest line needs p
port-cycles stalls the whole (lock-step) array p - 1 cycles. SPM updates commit in the order
`semantics.py` defines (cycle, iteration, node, lane), which also says how each op writes
back.

SCATTER_ACC (PIT's SWrite with accumulate, docs/references.md#pit) is an ACC whose address adds a
loaded index: it combines in the register over a run like ACC and read-modify-writes once per
run; every update to one word is applied in commit order, so the value is exact for that order.
Port cost: distinct SPM rows of one access are one row access each, as for any vector access,
but lanes that hit the same word must be serialised: the r-th lane to hit a word goes in the
r-th row access, so a row costs as many write accesses as its most-hit word has hits (its reads,
like every read of one row in one cycle, are one broadcast access). Different copies (PEs)
updating the same row in one cycle are separate accesses, as always, and serialise on the
line's ports (the stall arithmetic below).

Shortcuts that keep the results identical (accumulator runs folded by length, addresses as
lane 0 plus a stride, the tile timing memo):
docs/architecture.md#engine-speed-exact-shortcuts-of-the-fast-engine; address sums shared per
term set, compiled gathers, grouped MACC folds: docs/architecture.md#sharing-and-compiled-gathers.
"""

from __future__ import annotations

import functools
import math
import os
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from dataflow.arch.spec import AddressMapping, ArchSpec, SPMSpec
from dataflow.dfg.domain import enumerate_domain
from dataflow.dfg.graph import Node
from dataflow.dfg.ops import Op
from dataflow.mapper.mapping import KernelMapping, Tile
from dataflow.pe_array import fast_reads
from dataflow.pe_array.common import (
    Counters,
    lane_addresses,
    spm_base,
    tile_result,
)
from dataflow.pe_array.fast_policy import compiled_fold_pays, fold_spent
from dataflow.pe_array.result import TileResult
from dataflow.pe_array.semantics import (
    ACC_IDENTITY,
    ACC_UFUNC,
    apply_op,
    commit,
    commit_order,
    operands,
    stored_value,
)
from dataflow.spm.lines import StoreQueues, line_of_row, port_cycles

#: Environment switch of the tile timing memo (`tile_memo_enabled`).
MEMO_ENV = "DATAFLOW_TILE_MEMO"
#: Environment switch of the memo across runs (`_RunMemo`): on unless it is 0 (or false, no,
#: off); the tile memo off (DATAFLOW_TILE_MEMO=0) turns it off too.
RUNS_MEMO_ENV = "DATAFLOW_TILE_MEMO_RUNS"
#: Tiles run, tiles whose timing came from the memo and, of those, from an earlier run's tile,
#: over the process (tests read it to prove a shortcut was taken).
MEMO_STATS = {"tiles": 0, "hits": 0, "run_hits": 0}
#: Row index of an inactive lane in the row arrays (sorts before every real row).
NO_ROW = -1


@dataclass(frozen=True, eq=False)
class _Kernel:
    """What every tile of one mapped kernel reads: the mapping, the arch, lanes per access,
    the vector nodes, and `times[copy, node]`, the node's issue time in its copy (cycles)."""

    km: KernelMapping
    arch: ArchSpec
    dtype: object
    lanes: int
    vec: frozenset
    times: np.ndarray
    bufs: dict[str, np.ndarray]
    fetched: dict[str, int]
    # (iteration, copy, wave, all-live scalar mask) arrays by tile iteration count: tiles of
    # one size share them (read-only)
    layouts: dict = field(default_factory=dict)
    # MACC node id -> the ids of its group: MACCs of one term set and the same two inputs,
    # each taking one lane of input 0 (a GEMM's outer product), folded in one compiled call
    macc_groups: dict = field(default_factory=dict)
    # node id -> its lane-0 address's loop terms (`_affine_terms`), computed once per kernel
    terms: dict = field(default_factory=dict)


@dataclass(frozen=True, eq=False)
class _Waves:
    """Where a tile's n iterations run: iteration k on copy k // waves in wave k % waves;
    `active[k]` lanes of iteration k are live (`mask`, (n, lanes); `live` in all, `full` when
    every lane of every iteration is); the tile's schedule lasts `n_cycles` cycles before
    stalls."""

    n: int
    k: np.ndarray
    copy: np.ndarray
    wave: np.ndarray
    waves: int
    n_cycles: int
    active: np.ndarray
    mask: np.ndarray
    live: int = 0
    full: bool = False
    ones_mask: np.ndarray | None = None  # (n, 1) all live: a scalar access's mask, shared
    # per tile: affine address sums by term set (`_affine_base`), flush iterations by term set
    bases: dict = field(default_factory=dict)
    base_range: dict = field(default_factory=dict)
    flush_sel: dict = field(default_factory=dict)
    group_regs: dict = field(default_factory=dict)  # a MACC group's folded registers by node
    # a dense nest's loop values per axis in loop order (`enumerate_domain`'s order is their
    # row-major product), else None
    axes: dict | None = None


@dataclass(frozen=True, eq=False)
class _Writes:
    """SPM updates of one node: per update its issue cycle, iteration, addresses and values
    ((m, width)), and which lanes are live."""

    cycle: np.ndarray
    iteration: np.ndarray
    node: int
    addr: np.ndarray
    vals: np.ndarray
    mask: np.ndarray
    op: Op
    buffer: str


@dataclass
class _TileAccesses:
    """A tile's SPM traffic as it is issued: row reads (cycle, row), row writes as
    cycle * lines + line keys, and the updates to commit at the end of the tile."""

    reads: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    write_keys: list[np.ndarray] = field(default_factory=list)
    writes: list[_Writes] = field(default_factory=list)
    # row counts deferred until the tile's timing is known not to be memoised:
    # (node, addresses, live lanes, cycles) per access stream
    rows: list[tuple] = field(default_factory=list)
    # per memory node: (buffer, SPM word of lane 0 per iteration (`_Shifted`), lowest and
    # highest SPM word any lane may touch); the tile's address pattern (`_TimingMemo`)
    pattern: list[tuple[str, _Shifted, int, int]] = field(default_factory=list)
    indirect: dict = field(default_factory=dict)  # (terms, index, stride) -> (words, lo, hi)


@dataclass(frozen=True, eq=False)
class _Shifted:
    """Lane 0's SPM word per iteration as `base + off` (one int), without adding: nodes of one
    term set share `base` (`_affine_base`), so the memo compares it once."""

    base: np.ndarray
    off: int

    @staticmethod
    def parts(s0) -> tuple[np.ndarray, int]:
        """(base, off) of a `_Shifted` or of a plain array of words (off 0)."""
        return (s0.base, int(s0.off)) if isinstance(s0, _Shifted) else (np.asarray(s0), 0)


def same_word_rank(words: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """rank[e, l]: how many earlier active lanes of access e hit the same word as lane l
    (0 for the first). Lanes with equal rank can share one row access; see the module doc."""
    rank = np.zeros(words.shape, dtype=np.int64)
    for lane in range(1, words.shape[1]):
        same = (words[:, :lane] == words[:, lane:lane + 1]) & mask[:, :lane]
        rank[:, lane] = same.sum(axis=1)
    return rank


def tile_memo_enabled(memo: bool | None = None) -> bool:
    """Whether tile timing is memoised: `memo` when given, else the environment variable
    DATAFLOW_TILE_MEMO (on unless it is 0, false, no or off)."""
    if memo is not None:
        return memo
    return os.environ.get(MEMO_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def runs_memo_enabled() -> bool:
    """Whether tiles look up the timing an earlier run's tile of the same index left
    (`_RunMemo`): on unless the environment sets DATAFLOW_TILE_MEMO_RUNS=0."""
    return os.environ.get(RUNS_MEMO_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def _issue_times(km: KernelMapping) -> np.ndarray:
    """times[copy, node]: the cycle a node issues in its copy's schedule."""
    times = np.zeros((km.copies, len(km.kernel.nodes)), dtype=np.int64)
    for p in km.placements:
        times[p.copy, p.node] = p.time
    return times


def tile_layout(ctx: _Kernel, ti: int, tile: Tile, layouts: dict | None) -> tuple:
    """(domain, iterations, `_Waves`) of a tile: an earlier run's (`_RunMemo`) when kept, else
    made (and kept); (None, 0, None) for an empty tile."""
    got = layouts.get(ti) if layouts is not None else None
    if got is not None and got[0] == (tile.lo, tile.hi):
        _, dom, n, w = got
        w.group_regs.clear()
        return dom, n, w
    kernel = ctx.km.kernel
    dom = enumerate_domain(kernel, ctx.lanes, (tile.lo, tile.hi))
    n = len(dom[kernel.loops[0].var])
    if n == 0:
        return None, 0, None
    w = _waves(ctx, dom, n, _dense_axes(ctx, tile))
    if layouts is not None:
        RUNS.put_layout(layouts, ti, ((tile.lo, tile.hi), dom, n, w))
    return dom, n, w


def _run_tile(ctx: _Kernel, ct: Counters, ti: int, tile: Tile,
              timing: _TimingMemo | None = None, layout: tuple | None = None) -> TileResult:
    """One tile: issue every node over all iterations, count SPM ports, commit the updates."""
    km, kernel = ctx.km, ctx.km.kernel
    dom, n, w = layout or tile_layout(ctx, ti, tile, timing.layouts if timing else None)
    if n == 0:
        return tile_result(kernel, ti, 0, 0, 0, km, ctx.arch, tile, ctx.fetched)
    acc = _TileAccesses()
    vals: dict[int, np.ndarray] = {}
    for node in kernel.nodes:
        _issue_node(ctx, ct, w, dom, vals, acc, node, ti, tile)
    known = timing.recall(w, acc.pattern, ti) if timing is not None else None
    MEMO_STATS["tiles"] += 1
    MEMO_STATS["hits"] += known is not None
    if known is None:
        before = _TileCounts.of(ct)
        _count_busy_and_links(ctx, ct, w)
        for node, at, cyc in acc.rows:
            cyc = _cycles(ctx, w, node) if cyc is None else cyc
            _count_rows(ctx, acc, node, at, cyc, ti, tile)
        stall = _port_stalls(acc, ct, ctx.arch.spm, w.n_cycles)
        if timing is not None:
            timing.remember(w, acc.pattern, _TileCounts.of(ct).minus(before), stall, ti)
    else:
        counts, stall = known
        counts.add_to(ct)
    _apply_writes(acc.writes, ctx.bufs)
    return tile_result(kernel, ti, n, w.n_cycles + stall, stall, km, ctx.arch, tile, ctx.fetched)


@dataclass(frozen=True)
class _TileCounts:
    """What a tile adds to the kernel's timing counters (busy cycles per PE, word-hops, SPM
    reads, writes and conflict cycles per line)."""

    busy: np.ndarray
    hops: int
    reads: np.ndarray
    writes: np.ndarray
    conflicts: np.ndarray

    @staticmethod
    def of(ct: Counters) -> _TileCounts:
        return _TileCounts(ct.busy.copy(), ct.link_word_hops, ct.reads_line.copy(),
                           ct.writes_line.copy(), ct.conflicts_line.copy())

    def minus(self, before: _TileCounts) -> _TileCounts:
        return _TileCounts(self.busy - before.busy, self.hops - before.hops,
                           self.reads - before.reads, self.writes - before.writes,
                           self.conflicts - before.conflicts)

    def add_to(self, ct: Counters) -> None:
        ct.busy += self.busy
        ct.link_word_hops += self.hops
        ct.reads_line += self.reads
        ct.writes_line += self.writes
        ct.conflicts_line += self.conflicts


class _TimingMemo:
    """Timing of tiles already run, reused for a tile whose SPM traffic is provably the same.

    A tile's timing (stalls and every counter) is a function of its iteration count, the live
    lanes of each iteration and, per memory node, the SPM rows each access touches in each
    cycle: cycles follow from the iteration count alone (`_waves`), and every access's rows
    from its lane-0 SPM word (lanes add a fixed stride; an accumulator's flushes fall where
    lane 0's address changes). A new tile reuses a remembered tile's timing when it has the
    same iteration count and live lanes, and every memory node's lane-0 SPM words are the
    remembered ones shifted by one constant delta per buffer such that
    - delta is a whole number of rows and moves no row to another line (delta 0, or a multiple
      of words_per_row * lines under the interleaved mapping), so per-line counts are equal;
    - the buffers' SPM word ranges are pairwise disjoint, rows included, in both tiles (or all
      deltas are equal): reads of one row in one cycle count once, so rows of two buffers must
      not start or stop coinciding.
    Then every access touches the same rows up to the shift, in the same cycles, and the
    per-(cycle, line) port counts, stalls and counters are identical. The check costs O(n)
    per memory node (lane 0 only) against the O(n * lanes) sort and count it saves.
    `tests/test_fidelity.py` runs kernels with the memo on and off and against the reference
    stepper. At most `KEEP` patterns are held (host memory stays a few tiles' lane-0 words),
    besides `prior`: the entry each tile index left in an earlier run of a kernel mapping the
    timing cannot tell apart (`_RunMemo`), tried first and updated as tiles run."""

    KEEP = 2

    def __init__(self, spm: SPMSpec, prior: dict | None = None):
        self.spm = spm
        self.entries: list[tuple] = []
        self.hits = 0
        self.prior = prior
        # tile index -> ((lo, hi), domain, iterations, `_Waves`) an earlier run left
        self.layouts: dict | None = None

    def _shift_ok(self, delta: int) -> bool:
        if delta == 0:
            return True
        spm = self.spm
        return (spm.address_mapping == AddressMapping.INTERLEAVED
                and delta % (spm.words_per_row * spm.lines) == 0)

    def _disjoint(self, pattern) -> bool:
        """The buffers' SPM row ranges do not overlap."""
        spans: dict[str, list[int]] = {}
        wpr = self.spm.words_per_row
        for name, _, lo, hi in pattern:
            s = spans.setdefault(name, [lo, hi])
            s[0], s[1] = min(s[0], lo), max(s[1], hi)
        rows = sorted((lo // wpr, hi // wpr) for lo, hi in spans.values())
        return all(a[1] < b[0] for a, b in zip(rows, rows[1:]))

    def recall(self, w: _Waves, pattern, ti: int = -1) -> tuple[_TileCounts, int] | None:
        earlier = self.prior.get(ti) if self.prior is not None else None
        for entry in ([earlier] if earlier is not None else []) + self.entries:
            n, active, old, counts, stall = entry
            if n != w.n or len(old) != len(pattern) or not (
                    active is w.active or np.array_equal(active, w.active)):
                continue
            deltas: dict[str, int] = {}
            same: dict[tuple[int, int], bool] = {}  # base pairs already compared
            ok = True
            for (name, s0, _, _), (oname, o0, _, _) in zip(pattern, old):
                # s0 = base + off: s0 - delta == o0 exactly when base - d == obase
                (base, off), (obase, ooff) = _Shifted.parts(s0), _Shifted.parts(o0)
                d = int(base[0] - obase[0])
                delta = d + off - ooff
                if (name != oname or deltas.setdefault(name, delta) != delta
                        or not self._shift_ok(delta)):
                    ok = False
                    break
                key = (id(base), id(obase))
                if key not in same:  # one array (a layout an earlier run left): equal
                    same[key] = (base is obase and d == 0) or bool(np.array_equal(base - d,
                                                                                   obase))
                if not same[key]:
                    ok = False
                    break
            if not ok:
                continue
            if len(set(deltas.values())) > 1 and not (self._disjoint(pattern)
                                                      and self._disjoint(old)):
                continue
            self.hits += 1
            MEMO_STATS["run_hits"] += entry is earlier
            if self.prior is not None and entry is not earlier:
                RUNS.put(self.prior, ti, entry)
            return counts, stall
        return None

    def remember(self, w: _Waves, pattern, counts: _TileCounts, stall: int,
                 ti: int = -1) -> None:
        entry = (w.n, w.active, pattern, counts, stall)
        self.entries.insert(0, entry)
        del self.entries[self.KEEP:]
        if self.prior is not None:
            RUNS.put(self.prior, ti, entry)


class _RunMemo:
    """The tile memo's entries across runs: per kernel mapping, the entry (iteration count,
    live lanes, address pattern, counters, stall) each tile index last matched or left. A warm
    run of the same planned kernel (attention, dynamic-spmm, a model's repeated layers) checks
    each tile against the entry of its own index first, by `_TimingMemo.recall`'s exact test,
    so its timing is reused without counting SPM rows; values are always computed.

    Kernel mappings are told apart by what the timing reads besides the address pattern the
    test compares: the body's nodes (ops, address strides, which are vector), loops and
    buffers, copies, II, schedule length, placements (issue times, busy PEs), routes (word
    hops), SPM allocations, and the arch's SPM and PE array; two mappings equal in all of
    these time equal patterns equally. Held: the `KEEP_BYTES` most recently used bytes of
    patterns (lane-0 words), whole kernels dropped oldest first."""

    KEEP_BYTES = 64 << 20

    def __init__(self):
        self.kernels: OrderedDict[tuple, dict[int, tuple]] = OrderedDict()
        self.sizes: dict[int, int] = {}  # id(tiles dict) -> bytes held
        self.held = 0
        self.keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        # id(tiles dict) -> (the kernel's domain arrays, tile index -> layout), and bytes
        self.layouts: dict[int, tuple] = {}
        self.layout_sizes: dict[int, int] = {}
        self.layout_bytes = 0

    def key(self, km: KernelMapping, arch: ArchSpec) -> tuple | None:
        k = self.keys.get(km)
        if k is None or k[0] is not arch:
            kernel = km.kernel
            body = (kernel.nodes, kernel.loops, kernel.buffers, kernel.vector_var, km.copies,
                    km.ii, km.schedule_length, km.placements, km.routes, km.allocations,
                    arch.spm, arch.pe_array)
            try:
                hash(body)
            except TypeError:  # an unhashable constant in the body: no memo across runs
                body = None
            k = (arch, body)
            self.keys[km] = k
        return k[1]

    def tiles_of(self, km: KernelMapping, arch: ArchSpec) -> dict | None:
        """The tile-index -> entry table of `km` on `arch` (made empty the first time)."""
        key = self.key(km, arch)
        if key is None:
            return None
        tiles = self.kernels.get(key)
        if tiles is None:
            tiles = self.kernels[key] = {}
            self.sizes[id(tiles)] = 0
        self.kernels.move_to_end(key)
        return tiles

    def put(self, tiles: dict, ti: int, entry: tuple) -> None:
        """Hold `entry` as tile `ti`'s of the kernel `tiles` belongs to, within `KEEP_BYTES`:
        older kernels are dropped first; an entry the budget cannot hold beside this kernel's
        others (or a quarter of it alone) is not kept."""
        if id(tiles) not in self.sizes:  # dropped while its run went on
            return
        self._drop(tiles, ti)
        size = _entry_bytes(entry)
        if size > self.KEEP_BYTES // 4:
            return
        while self.held + size > self.KEEP_BYTES and len(self.kernels) > 1 \
                and next(iter(self.kernels.values())) is not tiles:
            _, dropped = self.kernels.popitem(last=False)
            self.held -= self.sizes.pop(id(dropped))
            self._drop_layouts(id(dropped))
        if self.held + size > self.KEEP_BYTES:
            return
        tiles[ti] = entry
        self.sizes[id(tiles)] += size
        self.held += size

    def _drop(self, tiles: dict, ti: int) -> None:
        old = tiles.pop(ti, None)
        if old is not None:
            size = _entry_bytes(old)
            self.sizes[id(tiles)] -= size
            self.held -= size

    def layouts_of(self, tiles: dict, kernel) -> dict:
        """The tile-index -> layout table of the kernel `tiles` belongs to: each tile's
        iteration domain and `_Waves` (address sums, flush iterations) an earlier run made,
        a function of the loops, the lanes, the copies (the key) and the domain arrays (a
        sparse loop's positions), which are compared here; emptied when those differ."""
        got = self.layouts.get(id(tiles))
        arrays = kernel.domain_arrays
        if got is None or len(got[0]) != len(arrays) or not all(
                n0 == n1 and (a0 is a1 or np.array_equal(a0, a1))
                for (n0, a0), (n1, a1) in zip(got[0], arrays)):
            self._drop_layouts(id(tiles))
            got = self.layouts[id(tiles)] = (arrays, {})
        return got[1]

    def put_layout(self, layouts: dict, ti: int, layout: tuple) -> None:
        """Hold tile `ti`'s layout (made read-only) while layouts stay under `KEEP_BYTES`."""
        _, dom, n, w = layout
        size = sum(a.nbytes for a in dom.values()) + 6 * 8 * n + w.mask.nbytes
        if self.layout_bytes + size > self.KEEP_BYTES:
            return
        for a in (*dom.values(), w.active, w.mask):
            a.flags.writeable = False
        layouts[ti] = layout
        self.layout_bytes += size
        self.layout_sizes[id(layouts)] = self.layout_sizes.get(id(layouts), 0) + size

    def _drop_layouts(self, tiles_id: int) -> None:
        got = self.layouts.pop(tiles_id, None)
        if got is not None:
            self.layout_bytes -= self.layout_sizes.pop(id(got[1]), 0)

    def clear(self) -> None:
        self.kernels.clear()
        self.sizes.clear()
        self.held = 0
        self.layouts.clear()
        self.layout_sizes.clear()
        self.layout_bytes = 0


def _entry_bytes(entry: tuple) -> int:
    """Host bytes a memo entry holds: its live lanes and its distinct lane-0 word arrays."""
    seen = {id(_Shifted.parts(s0)[0]): _Shifted.parts(s0)[0].nbytes for _, s0, _, _ in entry[2]}
    return entry[1].nbytes + sum(seen.values())


#: the process's memo across runs (`_RunMemo`)
RUNS = _RunMemo()


def _dense_axes(ctx: _Kernel, tile: Tile) -> dict[str, np.ndarray] | None:
    """Each loop's values when every loop is dense (the tile's range of the outer one, the
    vector loop in steps of the lanes): the domain is their row-major product."""
    kernel = ctx.km.kernel
    if not all(lp.is_dense for lp in kernel.loops):
        return None
    axes = {kernel.loops[0].var: np.arange(tile.lo, tile.hi, dtype=np.int64)}
    for lp in kernel.loops[1:]:
        step = ctx.lanes if lp.var == kernel.vector_var else 1
        axes[lp.var] = np.arange(0, lp.extent, step, dtype=np.int64)
    return axes


def _waves(ctx: _Kernel, dom: dict[str, np.ndarray], n: int,
           axes: dict[str, np.ndarray] | None = None) -> _Waves:
    """Each copy runs one contiguous chunk of ceil(n / copies) iterations, one per wave."""
    kernel, km = ctx.km.kernel, ctx.km
    waves = -(-n // km.copies)
    if kernel.vector_var:
        active = np.minimum(ctx.lanes, kernel.vector_extent - dom[kernel.vector_var])
    else:
        active = np.ones(n, dtype=np.int64)
    layout = ctx.layouts.get(n)
    if layout is None:
        chunks = -(-n // waves)  # copies that get iterations
        # k // waves and k % waves, without dividing n numbers
        layout = (np.arange(n, dtype=np.int64), np.repeat(np.arange(chunks), waves)[:n],
                  np.tile(np.arange(waves, dtype=np.int64), chunks)[:n],
                  np.ones((n, 1), dtype=bool))
        for a in layout:
            a.flags.writeable = False
        ctx.layouts.clear()  # host memory: one tile size's arrays
        ctx.layouts[n] = layout
    k, copy, wave, ones = layout
    full = bool(active.min() >= ctx.lanes)
    if full:
        mask = np.ones((n, ctx.lanes), dtype=bool)
    else:
        mask = np.arange(ctx.lanes)[None, :] < active[:, None]
    return _Waves(n=n, k=k, copy=copy, wave=wave, waves=waves,
                  n_cycles=(waves - 1) * km.ii + km.schedule_length, active=active,
                  mask=mask, live=int(active.sum()), full=full, ones_mask=ones, axes=axes)


def _count_busy_and_links(ctx: _Kernel, ct: Counters, w: _Waves) -> None:
    """Busy cycles per PE (one per iteration of its copy) and words moved over each link."""
    per_copy = np.bincount(w.copy, minlength=ctx.km.copies)
    for p in ctx.km.placements:
        ct.busy[p.pe] += per_copy[p.copy]
    starts = np.arange(0, w.n, w.waves)
    live = np.zeros(ctx.km.copies, dtype=np.int64)
    live[:len(starts)] = np.add.reduceat(w.active, starts)
    for r in ctx.km.routes:
        words = live[r.copy] if r.src in ctx.vec else per_copy[r.copy]
        ct.link_word_hops += len(r.links) * int(words)


def _issue_node(ctx: _Kernel, ct: Counters, w: _Waves, dom, vals: dict[int, np.ndarray],
                acc: _TileAccesses, node: Node, ti: int, tile: Tile) -> None:
    """All iterations of one node: its value, or its SPM accesses and updates."""
    is_vec = node.id in ctx.vec
    ct.op_counts[node.op.value] += w.live if is_vec else w.n
    if not node.op.is_memory:
        vals[node.id] = apply_op(node.op, operands(node, [vals[i] for i in node.inputs]),
                                 ctx.dtype, node.value)
        return
    at = _addresses(ctx, w, dom, vals, node)
    sbase, wlo = spm_base(ctx.km, node.buffer, ti, tile)
    reach = (at.width - 1) * at.stride  # what the last lane adds to lane 0
    if node.addr.index_stride:  # lane 0's SPM words: the indirect addresses shifted, shared
        # without the constant by nodes of one index and term set (the memo compares it once)
        key = (_affine_terms(ctx, node), node.inputs[0], node.lane, node.addr.index_stride)
        if key not in acc.indirect:
            b = at.a0 - node.addr.const if node.addr.const else at.a0
            acc.indirect[key] = (b, int(b.min()), int(b.max()))
        (base, lo, hi), off = acc.indirect[key], sbase - wlo + node.addr.const
    else:  # the tile's affine sum (shared by nodes of its term set) plus a constant
        terms = _affine_terms(ctx, node)
        base, off = w.bases[terms], sbase - wlo + node.addr.const
        if terms not in w.base_range:
            w.base_range[terms] = (int(base.min()), int(base.max()))
        lo, hi = w.base_range[terms]
    acc.pattern.append((node.buffer, _Shifted(base, off), lo + off + min(0, reach),
                        hi + off + max(0, reach)))
    if node.op.accumulates:
        flushes, sel = _flushes(ctx, w, vals, node, at)
        acc.writes.append(flushes)
        acc.rows.append((node, _Lanes(at.a0[sel], at.stride, at.width, flushes.mask,
                                      full=at.full), flushes.cycle))
        return
    if node.hold:
        acc.rows.append(_held_reads(ctx, w, node, at))
    else:
        acc.rows.append((node, at, None))  # issue cycles computed if the rows are counted
    buf = ctx.bufs[node.buffer]
    if node.op in (Op.LOAD, Op.GATHER):
        vals[node.id] = _gather(buf, at)
    else:
        addr = at.words()
        acc.writes.append(_Writes(_cycles(ctx, w, node), w.k, node.id, addr,
                                  _lane_values(vals, node, addr, ctx.dtype), at.mask, node.op,
                                  node.buffer))


@dataclass(frozen=True, eq=False)
class _Lanes:
    """The word addresses of an access stream without materialising them: lane l of access e
    is at a0[e] + l * stride, for `width` lanes; `mask` (e, width) says which are live (always
    a prefix of the lanes: past a loop's end, or past a span, lanes are dead); `full` when
    every lane is live."""

    a0: np.ndarray
    stride: int
    width: int
    mask: np.ndarray
    full: bool = False

    def words(self) -> np.ndarray:
        return lane_addresses(self.a0, self.stride, self.width)


def _gather(buf: np.ndarray, at: _Lanes) -> np.ndarray:
    """A load's values (e, width), dead lanes zero. Lanes at a positive stride are read as
    rows of a strided view of the buffer (one row copy per access, not one index per lane)."""
    if at.width == 1:
        return buf[at.a0][:, None]
    if at.stride <= 0 or len(at.a0) == 0 or int(at.a0.min()) < 0:
        addr = at.words()
        return np.where(at.mask, buf[np.where(at.mask, addr, 0)], 0).astype(buf.dtype)
    span = (at.width - 1) * at.stride
    if (buf.ndim == 1 and int(at.a0.max()) + span < len(buf)
            and compiled_fold_pays(4 * at.a0.size * at.width, np.float32)):
        out = np.empty((len(at.a0), at.width), dtype=buf.dtype)
        _compiled_gather()(buf, at.a0, at.stride, out)
        if not at.full:
            out[~at.mask] = 0
        return out
    flat = np.ascontiguousarray(buf)
    if int(at.a0.max()) + span >= len(flat):  # dead lanes of the last accesses run past the end
        flat = np.concatenate((flat, np.zeros(span + 1, dtype=flat.dtype)))
    rows = np.lib.stride_tricks.as_strided(
        flat, shape=(len(flat) - span, at.width),
        strides=(flat.itemsize, at.stride * flat.itemsize), writeable=False)
    out = rows[at.a0]
    if not at.full:
        out[~at.mask] = 0
    return out


def _affine_terms(ctx: _Kernel, node: Node) -> tuple:
    """The loop terms of a node's lane-0 address: all of them for a vector access (the vector
    loop's term is lane 0's), all but the vector loop's for a scalar one, unless it spans."""
    terms = ctx.terms.get(node.id)
    if terms is None:
        vv = ctx.km.kernel.vector_var
        terms = ctx.terms[node.id] = tuple(sorted(
            (v, c) for v, c in node.addr.terms if v != vv or node.addr.span or node.id in ctx.vec))
    return terms


def _affine_base(w: _Waves, dom, terms: tuple) -> np.ndarray:
    """sum of c * dom[v] over `terms`, once per tile and term set (`_Waves.bases`): nodes whose
    addresses differ only by their constant (a GEMM's MACCs into C's columns) share it. The
    array is read-only (every user adds to it into a new array)."""
    base = w.bases.get(terms)
    shape = tuple(len(vals) for vals in w.axes.values()) if w.axes is not None else ()
    if (base is None and shape and math.prod(shape) == w.n
            and all(v in w.axes for v, _ in terms)):  # a dense nest: broadcast along the axes
        grid = np.zeros((1,) * len(shape), dtype=np.int64)
        for v, c in terms:
            vals = w.axes[v]
            axis = list(w.axes).index(v)
            grid = grid + (c * vals).reshape((1,) * axis + (-1,) + (1,) * (len(shape) - axis - 1))
        base = np.ascontiguousarray(np.broadcast_to(grid, shape)).reshape(-1)
        base.flags.writeable = False
        w.bases[terms] = base
    if base is None:
        base = np.zeros(w.n, dtype=np.int64)
        tmp = np.empty(w.n, dtype=np.int64)
        for v, c in terms:
            if c == 1:
                base += dom[v]
            else:
                base += np.multiply(dom[v], c, out=tmp)
        base.flags.writeable = False
        w.bases[terms] = base
    return base


def _gather_loops(buf, a0, stride, out):  # pragma: no cover - compiled by numba
    """out[e, l] = buf[a0[e] + l * stride] (every lane inside `buf`)."""
    for e in range(a0.shape[0]):
        b = a0[e]
        for lane in range(out.shape[1]):
            out[e, lane] = buf[b + lane * stride]


@functools.cache
def _compiled_gather():
    import numba

    return numba.njit(cache=True)(_gather_loops)


def _addresses(ctx: _Kernel, w: _Waves, dom, vals, node: Node) -> _Lanes:
    """Word addresses and live lanes per iteration, `width` lanes for a vector access and one
    for a scalar one; an indirect access adds its loaded index times the stride."""
    kernel = ctx.km.kernel
    a = _affine_base(w, dom, _affine_terms(ctx, node))
    if node.addr.const:
        a = a + node.addr.const
    if node.addr.index_stride:
        a = a + node.addr.index_stride * vals[node.inputs[0]][:, node.lane or 0].astype(np.int64)
    if node.id not in ctx.vec:
        return _Lanes(a, 0, 1, w.ones_mask, full=True)
    if node.addr.span:  # consecutive words: lanes along memory, `span` of them live
        live = np.arange(ctx.lanes) < node.addr.span
        return _Lanes(a, 1, ctx.lanes, np.broadcast_to(live, (w.n, ctx.lanes)),
                      full=bool(live.all()))
    return _Lanes(a, node.addr.coef(kernel.vector_var), ctx.lanes, w.mask, full=w.full)


def _lane_values(vals, node: Node, addr: np.ndarray, dtype) -> np.ndarray:
    """The stored value (`semantics.stored_value`) broadcast to one value per address."""
    src = np.asarray(stored_value(node, [vals[i] for i in node.inputs], dtype))
    return np.broadcast_to(src if src.ndim == 2 else src.reshape(-1, 1), addr.shape)


def _held_reads(ctx: _Kernel, w: _Waves, node: Node, at: _Lanes) -> tuple:
    """A held load's SPM reads (docs/conventions.md#held-loads): only in the iterations whose
    lane-0 address differs from the copy's previous iteration's, or that start a copy's
    chunk; the others reuse the PE's register. (node, their addresses, their cycles)."""
    again = np.ones(w.n, dtype=bool)
    again[1:] = (at.a0[1:] != at.a0[:-1]) | (w.copy[1:] != w.copy[:-1])
    sel = np.flatnonzero(again)
    return node, _Lanes(at.a0[sel], at.stride, at.width, at.mask[sel], full=at.full), \
        _cycles(ctx, w, node, sel)


def _cycles(ctx: _Kernel, w: _Waves, node: Node, sel: np.ndarray | None = None) -> np.ndarray:
    """Issue cycle of `node` in each iteration (or in iterations `sel`): wave * II + its time
    in its copy's schedule."""
    if sel is None:
        return w.wave * ctx.km.ii + np.repeat(ctx.times[:, node.id], w.waves)[:w.n]
    return w.wave[sel] * ctx.km.ii + ctx.times[w.copy[sel], node.id]


def _flushes(ctx: _Kernel, w: _Waves, vals, node: Node,
             at: _Lanes) -> tuple[_Writes, np.ndarray]:
    """An accumulating node combines in its PE's register and writes the SPM once per run of
    same-address iterations on a copy, at the run's last iteration. Returns the flushes and
    the iterations they happen in."""
    # lane 0's address is an affine sum plus a constant unless indirect: nodes of one term set
    # flush in the same iterations (a run ends where the sum changes)
    key = None if node.addr.index_stride else _affine_terms(ctx, node)
    sel = w.flush_sel.get(key) if key is not None else None
    if sel is None:
        flush = np.ones(w.n, dtype=bool)
        lane0 = at.a0
        flush[:-1] = (lane0[1:] != lane0[:-1]) | (w.copy[1:] != w.copy[:-1])
        sel = np.flatnonzero(flush)
        if key is not None:
            w.flush_sel[key] = sel
    if node.op is Op.MACC and compiled_fold_pays(at.mask.size, ctx.dtype):
        if node.id in ctx.macc_groups and _macc_groups_on():
            reg = _group_macc_fold(ctx, w, vals, node, at.mask.shape, sel)
        else:
            reg = _macc_fold(ctx, vals, node, at.mask.shape, sel)
    else:
        src = _lane_values(vals, node, at.mask, ctx.dtype)
        reg = segment_fold(ACC_UFUNC[node.op], ACC_IDENTITY[node.op], src, sel, ctx.dtype)
    addr = lane_addresses(at.a0[sel], at.stride, at.width)
    return _Writes(_cycles(ctx, w, node, sel), w.k[sel], node.id, addr, reg, at.mask[sel],
                   node.op, node.buffer), sel


def segment_fold(ufunc, identity, src: np.ndarray, ends: np.ndarray, dtype) -> np.ndarray:
    """reg[r] = identity . src[s_r] . src[s_r + 1] . ... . src[ends[r]], folded strictly left to
    right (one rounding per step, as a PE's register does), for the runs of consecutive rows
    that end at `ends` (sorted; the last is the last row). The same values as
    `ufunc.at(reg, run, src)`, faster: runs of one length are folded together as a
    (runs, length, lanes) block (a reshape when every run has that length, else a gather)."""
    src = np.asarray(src)
    ragged = len(ends) > 1 and not _one_length(ends)
    if compiled_fold_pays(src.size, dtype, ragged):
        out = np.empty((len(ends),) + src.shape[1:], dtype=dtype)
        src2 = src.astype(dtype, copy=False).reshape(len(src), -1)
        _compiled_fold()(src2, np.asarray(ends, np.int64), np.dtype(dtype).type(identity),
                         ufunc is np.maximum, out.reshape(len(ends), -1))
        return out
    t0 = time.perf_counter()
    try:
        return _segment_fold_numpy(ufunc, identity, src, ends, dtype)
    finally:
        fold_spent["numpy_s"] += time.perf_counter() - t0


def _segment_fold_numpy(ufunc, identity, src: np.ndarray, ends: np.ndarray, dtype):
    starts = np.concatenate(([0], ends[:-1] + 1))
    lens = ends - starts + 1
    ident = np.asarray(identity, dtype=dtype)
    if len(lens) and int(lens.min()) == int(lens.max()):  # every run one length: a reshape
        block = src.astype(dtype, copy=False).reshape((len(lens), int(lens[0])) + src.shape[1:])
        return _fold_block(ufunc, ident, block)
    reg = np.empty((len(ends),) + src.shape[1:], dtype=dtype)
    for length in np.unique(lens):
        which = np.flatnonzero(lens == length)
        idx = starts[which][:, None] + np.arange(length)
        reg[which] = _fold_block(ufunc, ident, src[idx].astype(dtype, copy=False))
    return reg


def _one_length(ends: np.ndarray) -> bool:
    """Whether the runs ending at `ends` all have one length."""
    return bool(ends[0] + 1 == ends[1] - ends[0]
                and (len(ends) == 2 or np.all(np.diff(ends) == ends[1] - ends[0])))


def _fold_loops(src, ends, ident, is_max, out):  # pragma: no cover - compiled by numba
    """`segment_fold` as loops: each run from `ident`, left to right, one rounding per step;
    the maximum as np.maximum computes it (NaN wins, the first operand on ties). The lanes
    are independent chains, stepped together."""
    width = src.shape[1]
    reg = np.empty(width, dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for lane in range(width):
            reg[lane] = ident
        for i in range(start, ends[r] + 1):
            if is_max:
                for lane in range(width):
                    x = src[i, lane]
                    a = reg[lane]
                    if not (a >= x or a != a):
                        reg[lane] = x
            else:
                for lane in range(width):
                    reg[lane] = reg[lane] + src[i, lane]
        for lane in range(width):
            out[r, lane] = reg[lane]
        start = ends[r] + 1


def _macc_fold(ctx: _Kernel, vals, node: Node, shape, ends: np.ndarray) -> np.ndarray:
    """A MACC's flushed registers with the product fused into the compiled fold: each step
    adds the rounded product (`semantics.stored_value`: one rounded multiply, then the
    rounded add), no fused multiply-add."""
    a, b = (np.asarray(x).astype(ctx.dtype, copy=False)
            for x in operands(node, [vals[i] for i in node.inputs]))
    a, b = (np.broadcast_to(x if x.ndim == 2 else x.reshape(-1, 1), shape) for x in (a, b))
    out = np.empty((len(ends), shape[1]), dtype=ctx.dtype)
    _compiled_macc_fold()(a, b, np.asarray(ends, np.int64),
                          np.dtype(ctx.dtype).type(ACC_IDENTITY[node.op]), out)
    return out


def _macc_fold_loops(a, b, ends, ident, out):  # pragma: no cover - compiled by numba
    width = a.shape[1]
    reg = np.empty(width, dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for lane in range(width):
            reg[lane] = ident
        for i in range(start, ends[r] + 1):
            for lane in range(width):
                p = a[i, lane] * b[i, lane]
                reg[lane] = reg[lane] + p
        for lane in range(width):
            out[r, lane] = reg[lane]
        start = ends[r] + 1


#: Environment switch of the grouped MACC folds (`_group_macc_fold`; on unless 0).
MACC_GROUPS_ENV = "DATAFLOW_MACC_GROUPS"


def _macc_groups_on() -> bool:
    return os.environ.get(MACC_GROUPS_ENV, "1").strip().lower() not in ("0", "false", "no",
                                                                      "off")


def _group_maccs(ctx: _Kernel) -> None:
    """Fill `ctx.macc_groups`: MACC nodes with the same two inputs, each selecting a lane of
    input 0 (`Node.lane`), whose lane-0 addresses have one affine term set and no index, so
    they flush in the same iterations (`_flushes`); groups of two or more."""
    groups: dict[tuple, list[int]] = {}
    for n in ctx.km.kernel.nodes:
        if (n.op is Op.MACC and len(n.inputs) == 2 and n.lane is not None
                and not n.addr.index_stride):
            groups.setdefault((n.inputs, _affine_terms(ctx, n)), []).append(n.id)
    for ids in groups.values():
        if len(ids) > 1:
            for i in ids:
                ctx.macc_groups[i] = tuple(ids)


def _group_macc_fold(ctx: _Kernel, w: _Waves, vals, node: Node, shape,
                     ends: np.ndarray) -> np.ndarray:
    """`_macc_fold` of every MACC of `node`'s group at once (`_macc_group_loops`): each
    iteration reads input 1's lanes once and multiplies them by each member's lane of input 0
    (the rounded product, then the rounded add, one chain per member and lane, in order). The
    first member folds the group; the others take their registers from `w.group_regs`."""
    if node.id in w.group_regs:
        return w.group_regs.pop(node.id)
    ids = ctx.macc_groups[node.id]
    nodes = [ctx.km.kernel.nodes[i] for i in ids]
    a, b = (np.asarray(vals[i]).astype(ctx.dtype, copy=False) for i in node.inputs)
    b = np.broadcast_to(b if b.ndim == 2 else b.reshape(-1, 1), shape)
    lanes = np.array([n.lane for n in nodes], dtype=np.int64)
    out = np.empty((len(ids), len(ends), shape[1]), dtype=ctx.dtype)
    _compiled_macc_group()(a.reshape(len(a), -1), lanes, b, np.asarray(ends, np.int64),
                           np.dtype(ctx.dtype).type(ACC_IDENTITY[node.op]), out)
    for j, i in enumerate(ids):
        if i != node.id:
            w.group_regs[i] = out[j]
    return out[ids.index(node.id)]


def _macc_group_loops(a, lanes, b, ends, ident, out):  # pragma: no cover - compiled by numba
    """out[g, r, l] = ident + a[i, lanes[g]] * b[i, l] + ... over run r's iterations i, in
    order, one rounding per multiply and per add (independent chains, stepped together)."""
    groups, width = lanes.shape[0], b.shape[1]
    reg = np.empty((groups, width), dtype=out.dtype)
    start = 0
    for r in range(ends.shape[0]):
        for g in range(groups):
            for lane in range(width):
                reg[g, lane] = ident
        for i in range(start, ends[r] + 1):
            for g in range(groups):
                x = a[i, lanes[g]]
                for lane in range(width):
                    p = x * b[i, lane]
                    reg[g, lane] = reg[g, lane] + p
        for g in range(groups):
            for lane in range(width):
                out[g, r, lane] = reg[g, lane]
        start = ends[r] + 1


@functools.cache
def _compiled_macc_group():
    import numba

    return numba.njit(cache=True)(_macc_group_loops)


@functools.cache
def _compiled_macc_fold():
    import numba

    return numba.njit(cache=True)(_macc_fold_loops)


@functools.cache
def _compiled_fold():
    import numba

    return numba.njit(cache=True)(_fold_loops)


def _fold_block(ufunc, ident: np.ndarray, block: np.ndarray) -> np.ndarray:
    """Fold (runs, length, ...) along its second axis, left to right, from `ident`: one ufunc
    call per position when each call has enough work, else `ufunc.accumulate` (which also
    combines in order, never pairwise)."""
    runs, length = block.shape[:2]
    reg = ufunc(ident, block[:, 0])
    if length == 1:
        return reg
    if reg.size >= 256 or length <= 16:
        for j in range(1, length):
            ufunc(reg, block[:, j], out=reg)
        return reg
    block = block.copy()
    block[:, 0] = reg
    return ufunc.accumulate(block, axis=1)[:, -1]


def _count_rows(ctx: _Kernel, acc: _TileAccesses, node: Node, at: _Lanes, cyc: np.ndarray,
                ti: int, tile: Tile) -> None:
    """Record the SPM row accesses of each access: its distinct rows among live lanes, and for
    SCATTER_ACC one write access per rank of same-word lanes (see the module doc)."""
    spm = ctx.arch.spm
    sbase, wlo = spm_base(ctx.km, node.buffer, ti, tile)
    width, m = at.width, at.mask
    if node.op is not Op.SCATTER_ACC and abs(at.stride) * (width - 1) < spm.words_per_row:
        _count_rows_narrow(acc, node, sbase - wlo + at.a0, at, cyc, spm)
        return
    addr = at.words()
    srow = (sbase + (addr - wlo)) // spm.words_per_row
    if node.op is Op.SCATTER_ACC:
        srow = srow * width + same_word_rank(addr, m)
    srow = np.where(m, srow, NO_ROW)
    srow.sort(axis=1)
    first = np.ones_like(srow, dtype=bool)
    first[:, 1:] = srow[:, 1:] != srow[:, :-1]
    first &= srow != NO_ROW
    if node.op is Op.SCATTER_ACC:
        srow = np.where(srow != NO_ROW, srow // width, NO_ROW)
    ev, lane = np.nonzero(first)
    if node.op.reads_spm:
        acc.reads.append((cyc[ev], srow[ev, lane]))
    if node.op.writes_spm:
        acc.write_keys.append(cyc[ev] * spm.lines + line_of_row(srow[ev, lane], spm))


def _count_rows_narrow(acc: _TileAccesses, node: Node, word0: np.ndarray, at: _Lanes,
                       cyc: np.ndarray, spm: SPMSpec) -> None:
    """`_count_rows` for an access whose lanes span less than a row (a scalar, or a vector of
    stride s with |s| * (lanes - 1) < words_per_row): it touches the row of its first live
    lane and, when it differs, the row of its last. Live lanes are always a prefix (lanes past
    a loop's end, or past a span), so the last live lane is lane (live - 1). O(n), no sort."""
    stride, m = at.stride, at.mask
    if at.full:
        live = np.full(len(word0), at.width, dtype=np.int64)
    else:
        live = m.sum(axis=1) if m.shape[1] > 1 else m[:, 0].astype(np.int64)
    wpr = spm.words_per_row
    first = word0 // wpr
    last = (word0 + (live - 1) * stride) // wpr
    some = live > 0
    two = some & (last != first)
    cyc_rows = np.concatenate((cyc[some], cyc[two]))
    rows = np.concatenate((first[some], last[two]))
    if node.op.reads_spm:
        acc.reads.append((cyc_rows, rows))
    if node.op.writes_spm:
        acc.write_keys.append(cyc_rows * spm.lines + line_of_row(rows, spm))


def _port_stalls(acc: _TileAccesses, ct: Counters, spm: SPMSpec, n_cycles: int) -> int:
    """Stall cycles of the tile from its row accesses per (cycle, line); counts reads, writes
    and conflict cycles per line into `ct`."""
    size = n_cycles * spm.lines
    rd = fast_reads._compiled_read_counts(acc.reads, spm, n_cycles)
    if rd is None:
        rd = np.bincount(fast_reads._read_keys(acc.reads, spm),
                         minlength=size).reshape(n_cycles, spm.lines)
    keys = np.concatenate(acc.write_keys) if acc.write_keys else np.zeros(0, np.int64)
    wr = np.bincount(keys, minlength=size).reshape(n_cycles, spm.lines)
    if spm.write_queue_depth:
        sq = StoreQueues(spm)
        stall = 0
        for t in range(n_cycles):
            s_t, extra = sq.cycle(rd[t], wr[t])
            stall += s_t
            ct.conflicts_line += extra
        s_t, extra = sq.drain()
        stall += s_t
        ct.conflicts_line += extra
    else:
        need = port_cycles(rd, wr, spm) - 1
        stall = int(need.max(axis=1).sum())
        ct.conflicts_line += need.sum(axis=0)
    ct.reads_line += rd.sum(axis=0)
    ct.writes_line += wr.sum(axis=0)
    return stall


def _apply_writes(writes: list[_Writes], bufs: dict[str, np.ndarray]) -> None:
    """Commit a tile's SPM updates in the semantics' order, lanes in lane order.

    Consecutive updates (in commit order) of write nodes with one op and one buffer commit in
    one `commit` call: it applies its updates one after another in the order given, so one call
    over their concatenation equals one call per node. Values are cast to the buffer's dtype
    first, as `commit` casts them."""
    if not writes:
        return
    if len(writes) == 1:  # one node's updates (one op, one buffer): by cycle, then iteration
        w = writes[0]
        buf = bufs[w.buffer]
        order = np.lexsort((w.iteration, w.cycle))
        vals = np.broadcast_to(np.asarray(w.vals).astype(buf.dtype, copy=False), w.addr.shape)
        sel = w.mask[order]
        commit(w.op, buf, w.addr[order][sel], vals[order][sel])
        return
    cyc = np.concatenate([w.cycle for w in writes])
    k = np.concatenate([w.iteration for w in writes])
    node = np.concatenate([np.full(len(w.cycle), w.node) for w in writes])
    order = commit_order(cyc, k, node)
    kinds: dict[tuple, list[int]] = {}
    for j, w in enumerate(writes):
        kinds.setdefault((w.op, w.buffer), []).append(j)
    kind_of = np.empty(len(writes), dtype=np.int64)
    local = np.empty(len(order), dtype=np.int64)  # position within its kind's concatenation
    offsets = np.cumsum([0] + [len(w.cycle) for w in writes])
    stacked = []
    for ki, ((op, name), js) in enumerate(kinds.items()):
        kind_of[js] = ki
        width = max(writes[j].addr.shape[1] for j in js)
        dt = bufs[name].dtype
        parts_a, parts_v, parts_m, at = [], [], [], 0
        for j in js:
            w = writes[j]
            pad = ((0, 0), (0, width - w.addr.shape[1]))
            vals = np.broadcast_to(np.asarray(w.vals).astype(dt, copy=False), w.addr.shape)
            if pad[1][1]:
                parts_a.append(np.pad(w.addr, pad))
                parts_v.append(np.pad(vals, pad))
                parts_m.append(np.pad(w.mask, pad))
            else:
                parts_a.append(w.addr)
                parts_v.append(vals)
                parts_m.append(w.mask)
            local[offsets[j]:offsets[j + 1]] = at + np.arange(len(w.cycle))
            at += len(w.cycle)
        stacked.append((op, bufs[name], *(p[0] if len(p) == 1 else np.concatenate(p)
                                          for p in (parts_a, parts_v, parts_m))))
    which = np.searchsorted(offsets, order, side="right") - 1
    kind = kind_of[which]
    # updates of different buffers commute: each buffer's updates in commit order, one
    # `commit` call per run of one op among them (one call per buffer unless ops mix in it)
    names = list(dict.fromkeys(name for _, name in kinds))
    buffer_of = np.array([names.index(name) for _, name in kinds], dtype=np.int64)
    per_buffer = ([np.arange(len(order))] if len(names) == 1 else
                  [np.flatnonzero(buffer_of[kind] == b) for b in range(len(names))])
    for pos in per_buffer:
        breaks = np.flatnonzero(np.diff(kind[pos])) + 1
        for run in (np.split(pos, breaks) if len(breaks) else (pos,)):
            if not len(run):
                continue
            op, buf, a, v, m = stacked[kind[run[0]]]
            idx = local[order[run]]
            sel = m[idx]
            commit(op, buf, a[idx][sel], v[idx][sel])
