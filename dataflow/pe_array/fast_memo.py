"""The fast engine's tile timing memo (`fast.py`; docs/architecture.md#tile-timing-memo):
a tile whose SPM traffic is provably the same as a remembered tile's, up to one shift per
buffer that keeps every access on its line, takes that tile's timing (`_TimingMemo`); and an
earlier run's tile of the same index is remembered across runs (`_RunMemo`, `RUNS`, within a
byte budget). Values are always computed; only timing is reused.
"""

from __future__ import annotations

import os
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from dataflow.arch.spec import AddressMapping, ArchSpec, SPMSpec
from dataflow.mapper.mapping import KernelMapping
from dataflow.pe_array.common import Counters

#: Environment switch of the tile timing memo (`tile_memo_enabled`).
MEMO_ENV = "DATAFLOW_TILE_MEMO"
#: Environment switch of the memo across runs (`_RunMemo`): on unless it is 0 (or false, no,
#: off); the tile memo off (DATAFLOW_TILE_MEMO=0) turns it off too.
RUNS_MEMO_ENV = "DATAFLOW_TILE_MEMO_RUNS"
#: Tiles run, tiles whose timing came from the memo and, of those, from an earlier run's tile,
#: over the process (tests read it to prove a shortcut was taken).
MEMO_STATS = {"tiles": 0, "hits": 0, "run_hits": 0}
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
    `tests/test_fast_shortcuts.py` runs kernels with the memo on and off and against the reference
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

    def recall(self, w, pattern, ti: int = -1) -> tuple[_TileCounts, int] | None:
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

    def remember(self, w, pattern, counts: _TileCounts, stall: int,
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
