"""`lower_row_max`: a row maximum (`accmax`) without a max-accumulate unit
(docs/conventions.md#row-maximum-without-accmax).

An `accmax` keeps a row's running maximum in its PE's register and flushes it with a
read-modify-write; an array whose load/store unit only adds (`acc`, the MLX preset) cannot.
The maximum is exact and idempotent (max(x, x) = x), so it is computed by doubling instead,
from `max`, loads, gathers and a store -- ops such an array has:

- level kernels t = 0 .. K-1 (K = floor(log2 of the longest row)) over the entries:
  T[t+1][p] = max(T[t][p], T[t][p + 2^t]), so T[t][p] is the maximum of the 2^t entries from
  p (T[0] the values the accmax took). Near a row's end such a window runs into the next row;
  those entries are never read below. The first level walks the rows and their entries (T[0]
  has no word past its end); the others are vector loops over chunks of `CHUNK` entries into
  buffers with spare words past the end, so every level streams in tiles.
- row kernels, one per level k that some row needs: a row of L entries from s to e, k =
  floor(log2 L), has max = max(T[k][s], T[k][e - 2^k + 1]) -- two windows of 2^k inside the
  row that cover it (they overlap; max does not mind). The rows of one k are gathered through
  three small index inputs (row, s, e - 2^k + 1) and scattered into the accmax's buffer, which
  keeps its init (-inf) where no row writes.

Values are bit-equal to the accmax's (a maximum is exact; NaN propagates through np.maximum as
it does through the accumulation). The index inputs are O(rows) words, not O(entries).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, BufferRole, DFGError, Kernel, Loop, Node, Program
from dataflow.dfg.ops import Op


@dataclasses.dataclass(frozen=True)
class _RowMax:
    """What one accmax kernel computes: the maximum of each row's entries of `values` (a
    buffer, entries of row i at starts[i] .. starts[i + 1] - 1) into `target[i]`."""

    values: str
    entries: int
    starts: np.ndarray
    target: Buffer
    prelude: Kernel | None  # a kernel that stores the accmax's input to `values`, if needed


def _entry_address(kernel: Kernel) -> tuple[Addr, np.ndarray] | None:
    """(address of entry (i, p) in a flat array, row starts) for a kernel over rows i and their
    entries: a sparse loop off a dense row loop (entry p), or two dense loops (i * W + t)."""
    if len(kernel.loops) != 2 or kernel.vector_var is not None:
        return None
    row, inner = kernel.loops
    if not row.is_dense:
        return None
    if not inner.is_dense:
        if inner.parent != row.var:
            return None
        pos = np.asarray(kernel.domain[inner.pos], dtype=np.int64)
        return Addr(((inner.var, 1),)), pos
    width = inner.extent
    return (Addr(((row.var, width), (inner.var, 1))),
            np.arange(row.extent + 1, dtype=np.int64) * width)


def _analyse(kernel: Kernel) -> _RowMax:
    where = f"kernel {kernel.name!r}: lower_row_max"
    acc = [n for n in kernel.nodes if n.op is Op.ACC_MAX]
    if len(acc) != 1:
        raise DFGError(f"{where}: needs one accmax, got {len(acc)}")
    node = acc[0]
    found = _entry_address(kernel)
    row = kernel.loops[0].var
    if found is None or node.addr != Addr(((row, 1),)) or node.addr.index_stride:
        raise DFGError(f"{where}: needs loops over rows and their entries, the accmax at "
                       "the row's word")
    entry, starts = found
    others = [n for n in kernel.nodes if n.op.writes_spm and n is not node]
    if others:
        raise DFGError(f"{where}: node %{others[0].id} also writes; only the accmax may")
    target = kernel.buffer_map[node.buffer]
    src = kernel.nodes[node.inputs[0]]
    entries = int(starts[-1])
    if src.op is Op.LOAD and src.addr == entry:
        return _RowMax(src.buffer, entries, starts, target, None)
    # the value is computed (a bias added first, DIA): store it, one word per entry
    name = f"{node.buffer}_values"
    nodes = tuple(dataclasses.replace(n, op=Op.STORE, buffer=name, addr=entry,
                                      name=f"{name}=") if n is node else n
                  for n in kernel.nodes)
    buffers = tuple(b for b in kernel.buffers if b.name != node.buffer) + (
        Buffer(name, _level_size(entries, 0), BufferRole.OUTPUT),)  # spare words: see below
    prelude = dataclasses.replace(kernel, name=f"{kernel.name}.values", nodes=nodes,
                                  buffers=buffers,
                                  carried=tuple(e for e in kernel.carried
                                                if node.id not in e[:2]))
    prelude.verify()
    return _RowMax(name, entries, starts, target, prelude)


#: entries per iteration of a level kernel's outer loop (8 vectors of 8 lanes): the tiles
#: stream whole chunks, so no level buffer is resident
CHUNK = 64


def _level_size(entries: int, t: int) -> int:
    """Words of T[t]: every chunk the level kernels write, and the 2^t words a window may
    read past them (never written: the buffer's init, read only by windows whose result is
    never used). T[0], the values, has them when an earlier kernel makes it."""
    return -(-entries // CHUNK) * CHUNK + (1 << t)


def level_words(entries: int, longest_row: int) -> int:
    """Words of the largest level buffer a row kernel gathers from, resident whole (T[k] for
    k = floor(log2 of the longest row)): what a split must leave room for
    (`dataflow.attention.split.plan_split`)."""
    return _level_size(entries, max(0, int(longest_row).bit_length() - 1))


def _first_level(name: str, src: str, dst: str, entries: int, row: Loop,
                 starts: np.ndarray) -> Kernel:
    """T[1][p] = max(src[p], src[p + 1]) for p < entries - 1, over the rows and their entries
    (the source has no spare word past its end, so this level is the exact range; a row
    loop, so it streams in row tiles)."""
    pos = f"{name}_pos"
    nodes = (
        Node(0, Op.LOAD, buffer=src, addr=Addr((("p", 1),)), name="x[p]"),
        Node(1, Op.LOAD, buffer=src, addr=Addr((("p", 1),), 1), name="x[p+1]"),
        Node(2, Op.MAX, (0, 1), name="max"),
        Node(3, Op.STORE, (2,), buffer=dst, addr=Addr((("p", 1),)), name=f"{dst}="),
    )
    last = np.minimum(starts, entries - 1).astype(np.int64)
    return Kernel(name=name, loops=(Loop(row.var, row.extent), Loop("p", pos=pos,
                                                                     parent=row.var)),
                  nodes=nodes, domain_arrays=((pos, last),),
                  buffers=(Buffer(src, entries),
                           Buffer(dst, _level_size(entries, 1), BufferRole.OUTPUT,
                                  init=-np.inf)))


def _level_kernel(name: str, src: str, dst: str, entries: int, t: int) -> Kernel:
    """T[t+1][p] = max(T[t][p], T[t][p + 2^t]) (t >= 1) over whole chunks covering every p
    whose window fits, a vector loop over each chunk."""
    step = 1 << t
    chunks = -(-(entries - 2 * step + 1) // CHUNK)
    at = (("o", CHUNK), ("p", 1))
    nodes = (
        Node(0, Op.LOAD, buffer=src, addr=Addr(at), name="x[p]"),
        Node(1, Op.LOAD, buffer=src, addr=Addr(at, step), name=f"x[p+{step}]"),
        Node(2, Op.MAX, (0, 1), name="max"),
        Node(3, Op.STORE, (2,), buffer=dst, addr=Addr(at), name=f"{dst}="),
    )
    return Kernel(name=name, loops=(Loop("o", chunks), Loop("p", CHUNK)), nodes=nodes,
                  buffers=(Buffer(src, _level_size(entries, t)),
                           Buffer(dst, _level_size(entries, t + 1), BufferRole.OUTPUT,
                                  init=-np.inf)),
                  vector_var="p")


def _row_kernel(name: str, src: str, src_size: int, target: Buffer, k: int,
                rows: np.ndarray, first: np.ndarray, second: np.ndarray) -> tuple[Kernel, tuple]:
    """target[rows[r]] = max(src[first[r]], src[second[r]]) over the rows of level k (a
    later row kernel starts from what an earlier one wrote: the program's data)."""
    tag = f"{name}_k{k}"
    nodes = (
        Node(0, Op.LOAD, buffer=f"{tag}_s", addr=Addr((("r", 1),)), name="s"),
        Node(1, Op.GATHER, (0,), buffer=src, addr=Addr(index_stride=1), name="x[s]"),
        Node(2, Op.LOAD, buffer=f"{tag}_e", addr=Addr((("r", 1),)), name=f"e-{(1 << k) - 1}"),
        Node(3, Op.GATHER, (2,), buffer=src, addr=Addr(index_stride=1), name="x[e]"),
        Node(4, Op.MAX, (1, 3), name="max"),
        Node(5, Op.LOAD, buffer=f"{tag}_i", addr=Addr((("r", 1),)), name="row"),
        Node(6, Op.SCATTER, (5, 4), buffer=target.name, addr=Addr(index_stride=1),
             name=f"{target.name}="),
    )
    n = len(rows)
    kernel = Kernel(name=f"{name}.rows{k}", loops=(Loop("r", n),), nodes=nodes,
                    buffers=(Buffer(f"{tag}_s", n), Buffer(src, src_size),
                             Buffer(f"{tag}_e", n), Buffer(f"{tag}_i", n), target))
    inputs = ((f"{tag}_s", first), (f"{tag}_e", second), (f"{tag}_i", rows))
    return kernel, inputs


def row_max_kernels(kernel: Kernel, spare: bool = False) -> tuple[tuple[Kernel, ...], tuple]:
    """The kernels that replace accmax kernel `kernel` (the module docstring), and the index
    inputs they read (name, int64 array). `spare`: the values' buffer has the spare words
    of `_level_size(entries, 0)` (declared so by every kernel), so the first level is a
    chunked vector loop too."""
    rm = _analyse(kernel)
    spare = spare or rm.prelude is not None
    lengths = np.diff(rm.starts)
    rows = np.flatnonzero(lengths > 0)
    out: list[Kernel] = [] if rm.prelude is None else [rm.prelude]
    inputs: list[tuple[str, np.ndarray]] = []
    if len(rows) == 0:  # no entries: the target keeps its init; one kernel still writes it
        raise DFGError(f"kernel {kernel.name!r}: lower_row_max: no row has an entry")
    level = np.floor(np.log2(lengths[rows])).astype(np.int64)
    top = int(level.max())
    names = [rm.values] + [f"{kernel.name}_t{t + 1}" for t in range(top)]
    sizes = [_level_size(rm.entries, 0) if spare else rm.entries] + [
        _level_size(rm.entries, t) for t in range(1, top + 1)]
    for t in range(top):
        label = f"{kernel.name}.level{t + 1}"
        out.append(_first_level(label, names[0], names[1], rm.entries, kernel.loops[0],
                                rm.starts) if t == 0 and not spare else
                   _level_kernel(label, names[t], names[t + 1], rm.entries, t))
    for k in np.unique(level):
        sel = rows[level == k]
        s = rm.starts[sel]
        e = rm.starts[sel + 1] - (1 << int(k))
        kern, ins = _row_kernel(kernel.name, names[k], sizes[k], rm.target, int(k),
                                sel.astype(np.int64), s, e)
        out.append(kern)
        inputs.extend(ins)
    return tuple(out), tuple(inputs)


def _resized(kernel: Kernel, buffer: str, size: int) -> Kernel:
    """`kernel` with `buffer` declared `size` words (at least as many as it had)."""
    return dataclasses.replace(kernel, buffers=tuple(
        dataclasses.replace(b, size=size) if b.name == buffer else b for b in kernel.buffers))


def has_accmax(program: Program) -> bool:
    return any(n.op is Op.ACC_MAX for k in program.kernels for n in k.nodes)


def lower_row_max(program: Program) -> Program:
    """`program` with every accmax kernel replaced by `row_max_kernels` (same values), the
    index inputs added. Kernels without an accmax are unchanged."""
    kernels: list[Kernel] = []
    inputs = list(program.inputs)
    outside = set(program.input_map) | {name for name, _ in program.outputs}
    resized: dict[str, int] = {}
    for k in program.kernels:
        if any(n.op is Op.ACC_MAX for n in k.nodes):
            rm = _analyse(k)
            # values an earlier kernel makes (attention's scores) get spare words past their
            # end, declared in every kernel (the producer writes only the entries), so the
            # first level streams in chunks; a program input or output keeps its size
            spare = rm.prelude is None and rm.values not in outside
            if spare:
                resized[rm.values] = _level_size(rm.entries, 0)
            new, ins = row_max_kernels(k, spare)
            kernels.extend(new)
            inputs.extend(ins)
        else:
            kernels.append(k)
    for name, size in resized.items():
        kernels = [_resized(x, name, size) for x in kernels]
    out = dataclasses.replace(program, kernels=tuple(kernels), inputs=tuple(inputs))
    out.verify()
    return out


__all__ = ["has_accmax", "lower_row_max", "row_max_kernels"]
