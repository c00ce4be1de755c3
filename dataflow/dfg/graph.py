"""`Kernel` and `Program`: the objects between the frontend and the mapper.

A `Kernel` is one loop nest: an iteration domain (`Loop`s, outermost first, whose extents may
come from a sparse operand's `pos` array) and a small dataflow graph of its body (`Node`s from
the one `Op` enum). Memory nodes carry an `Addr`: an affine function of the loop variables, plus
(for gathers and scatters) a loaded index times a stride. The innermost dense loop may be the
`vector_var`, executed `simd_lanes` elements at a time.

Graphs live in networkx behind `Kernel.graph()` (imported there: checking a kernel needs no
networkx); nodes themselves are immutable and edited only with `dataclasses.replace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from dataflow.dfg.ops import ARITY, Op
from dataflow.errors import UserError

if TYPE_CHECKING:
    import networkx as nx

# Deferred imports: networkx is imported in `Kernel.graph` (start-up: a tenth of a second).


class DFGError(UserError):
    """A malformed kernel or program (names the kernel and the node)."""


@dataclass(frozen=True)
class Addr:
    """Word address = const + sum(coef * loop_var) + index_stride * value(index input).

    `span` > 0 makes the access a vector of `span` consecutive words from that address, lanes
    along memory rather than along the kernel's vector loop, whose variable (if the address
    uses it) counts as a plain term (a row of a packed panel: the register-blocked GEMM's
    column of A, docs/conventions.md#register-blocking)."""

    terms: tuple[tuple[str, int], ...] = ()
    const: int = 0
    index_stride: int = 0
    span: int = 0

    def coef(self, var: str) -> int:
        return sum(c for v, c in self.terms if v == var)

    def __str__(self) -> str:
        parts = [f"{c}*{v}" if c != 1 else v for v, c in self.terms]
        if self.index_stride:
            parts.append(f"{self.index_stride}*idx" if self.index_stride != 1 else "idx")
        if self.const or not parts:
            parts.append(str(self.const))
        text = " + ".join(parts)
        return f"{text} : {self.span}" if self.span else text


@dataclass(frozen=True)
class Node:
    id: int
    op: Op
    inputs: tuple[int, ...] = ()
    buffer: str | None = None
    addr: Addr | None = None
    value: float = 0.0  # for CONST
    name: str = ""
    # mul / macc: input 0 is this lane of a vector, broadcast to every lane (an outer product's
    # column operand); gather: its index is this lane of input 0, a row load of consecutive
    # words (docs/conventions.md#nonzero-unroll); None: inputs are used as they are
    lane: int | None = None
    # load: its value is held in the PE's register and the SPM read again only when the
    # address changes from its copy's previous iteration (docs/conventions.md#held-loads)
    hold: bool = False

    def __str__(self) -> str:
        mem = f" {self.buffer}[{self.addr}]" if self.buffer else ""
        ins = [f"%{i}" for i in self.inputs]
        if self.lane is not None and ins:
            ins[0] += f".lane{self.lane}"
        ins_text = f"({', '.join(ins)})" if ins else ""
        return f"%{self.id} = {self.op.value}{ins_text}{mem}{' held' if self.hold else ''}"


@dataclass(frozen=True)
class Loop:
    """One loop level. Dense: `range(extent)`. Compressed: `range(pos[parent], pos[parent+1])`
    with `pos` the named domain array (a sparse operand's positions)."""

    var: str
    extent: int = 0
    pos: str | None = None
    parent: str | None = None

    @property
    def is_dense(self) -> bool:
        return self.pos is None


class BufferRole(str, Enum):
    """Whether a buffer comes in (from DRAM or an earlier kernel), goes out, or stays on chip.
    A str enum: equal to its word, so kernels built with `"output"` compare the same."""

    INPUT = "input"
    OUTPUT = "output"
    TEMP = "temp"

    def __str__(self) -> str:  # messages print the word
        return self.value


class BufferFetch(str, Enum):
    """How a resident input crosses the DRAM interface (`Buffer.fetch`)."""

    WHOLE = "whole"  # all `size` words
    GATHER = "gather"  # an indirect DMA of only the SPM rows its gathers touch (PIT's SRead)
    # handed from kernel to kernel in the SPM: the producer leaves it there, the consumer reads
    # it there, no DMA either way (docs/conventions.md#moe-buffers-handed-over-in-the-spm)
    ON_CHIP = "on_chip"
    # an input loaded whole as usual and then left in the SPM for the next kernel, which reads
    # it with "on_chip" (one DRAM read for two kernels)
    KEEP = "keep"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Buffer:
    """A named array of `size` words; `role` is `input`, `output` or `temp` (`BufferRole`). A
    buffer no input provides starts filled with `init` (-inf for the target of a
    max-accumulate). `fetch` is how a resident input crosses the DRAM interface: "whole" (all
    `size` words) or "gather" (an indirect DMA of only the SPM rows its gathers touch, PIT's
    SRead from memory; see `dataflow.pe_array.common.gather_fetch_words`) or "on_chip" (an
    intermediate handed over in the SPM: the producing kernel's output and the next kernel's
    input, resident in both at the same SPM words, never crossing the DRAM interface) or
    "keep" (an input loaded as "whole" and left in the SPM for a later kernel that reads it
    "on_chip"); `spm_base` fixes the SPM word where such a held buffer sits in every kernel
    that holds it (None: held buffers first, from word 0;
    docs/conventions.md#moe-buffers-handed-over-in-the-spm). `pitch` is
    (cols, row pitch) of an output stored with padded rows (`layout.pitch_output_rows`):
    the pad words stay on chip, the DMA moves cols of every pitch words."""

    name: str
    size: int
    role: BufferRole = BufferRole.INPUT
    init: float = 0.0
    fetch: BufferFetch = BufferFetch.WHOLE
    pitch: tuple[int, int] | None = None
    spm_base: int | None = None

    @property
    def on_chip(self) -> bool:
        """Whether the buffer is handed between kernels in the SPM (no DMA)."""
        return self.fetch == BufferFetch.ON_CHIP

    @property
    def held(self) -> bool:
        """Whether the buffer is held whole in the SPM for or from another kernel."""
        return self.fetch in (BufferFetch.ON_CHIP, BufferFetch.KEEP)

    def dma_words(self, lo: int, hi: int) -> int:
        """Words the DMA moves for the buffer's words lo .. hi - 1: all of them, or a pitched
        buffer's logical ones (those at a column below cols of their row)."""
        if hi <= lo:
            return 0
        if self.pitch is None:
            return hi - lo
        cols, pitch = self.pitch

        def before(x: int) -> int:  # logical words below address x
            return (x // pitch) * cols + min(x % pitch, cols)
        return before(hi) - before(lo)


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str
    loops: tuple[Loop, ...]
    nodes: tuple[Node, ...]
    buffers: tuple[Buffer, ...]
    vector_var: str | None = None
    domain_arrays: tuple[tuple[str, np.ndarray], ...] = ()  # name -> int64 pos arrays
    carried: tuple[tuple[int, int, int], ...] = ()  # (src, dst, distance) loop-carried edges

    # identity semantics: kernels hold arrays, so hash/eq are by object
    def __hash__(self) -> int:
        return id(self)

    @cached_property
    def domain(self) -> dict[str, np.ndarray]:
        return dict(self.domain_arrays)

    @property
    def vector_extent(self) -> int:
        """Element extent of the vector loop (1 when there is none)."""
        for lp in self.loops:
            if lp.var == self.vector_var:
                return lp.extent
        return 1

    @cached_property
    def buffer_map(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def graph(self) -> nx.DiGraph:
        """The body as a networkx DiGraph; edges carry `distance` (0 = same iteration)."""
        import networkx as nx

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(n.id, node=n)
        for n in self.nodes:
            for i in n.inputs:
                g.add_edge(i, n.id, distance=0)
        for src, dst, dist in self.carried:
            g.add_edge(src, dst, distance=dist)
        return g

    def verify(self) -> None:
        """Raise DFGError unless the kernel is well formed."""
        where = f"kernel {self.name!r}"
        self._verify_ids_and_loops(where)
        self._verify_vector_loop(where)
        self._verify_no_read_after_write(where)
        for n in self.nodes:
            self._verify_node(where, n)
        self._verify_fetch(where)
        self._verify_carried(where)

    def _verify_ids_and_loops(self, where: str) -> None:
        """Node ids 0..n-1 in order; distinct loop variables; sparse loops name a known pos
        array and an enclosing parent; dense extents are not negative."""
        ids = [n.id for n in self.nodes]
        if ids != list(range(len(ids))):
            raise DFGError(f"{where}: node ids must be 0..n-1 in order, got {ids}")
        loop_vars = [lp.var for lp in self.loops]
        if len(set(loop_vars)) != len(loop_vars):
            raise DFGError(f"{where}: duplicate loop variables {loop_vars}")
        for k, lp in enumerate(self.loops):
            if not lp.is_dense:
                if lp.pos not in self.domain:
                    raise DFGError(f"{where}: loop {lp.var!r} uses unknown pos array {lp.pos!r}")
                if lp.parent not in loop_vars[:k]:
                    raise DFGError(f"{where}: loop {lp.var!r} needs an enclosing parent loop")
            elif lp.extent < 0:
                raise DFGError(f"{where}: loop {lp.var!r} has negative extent")

    def _verify_vector_loop(self, where: str) -> None:
        """The vector loop is dense, not the outermost, and no sparse loop hangs off it."""
        if self.vector_var is None:
            return
        vl = [lp for lp in self.loops if lp.var == self.vector_var]
        if not vl or not vl[0].is_dense or vl[0] is self.loops[0]:
            raise DFGError(f"{where}: vector_var must be a dense loop inside the outermost")
        if any(lp.parent == self.vector_var for lp in self.loops):
            raise DFGError(f"{where}: no sparse loop may hang off the vector loop")

    def _verify_no_read_after_write(self, where: str) -> None:
        written = {n.buffer for n in self.nodes if n.op.writes_spm}
        for n in self.nodes:
            if n.op in (Op.LOAD, Op.GATHER) and n.buffer in written:
                raise DFGError(f"{where}: node %{n.id} loads {n.buffer!r}, which the kernel "
                               "also writes (read-after-write inside a kernel is not modelled)")

    def _verify_node(self, where: str, n: Node) -> None:
        """Arity, inputs from earlier nodes only, and (memory nodes) buffer and address."""
        if len(n.inputs) != ARITY[n.op]:
            raise DFGError(f"{where}: node %{n.id} {n.op.value} takes {ARITY[n.op]} inputs")
        if any(i >= n.id for i in n.inputs):
            raise DFGError(f"{where}: node %{n.id} uses a later node "
                           "(body must be a DAG in order)")
        if n.op.is_memory:
            self._verify_memory_node(where, n)
        if n.lane is not None and (not n.op.selects_lane or n.lane < 0):
            raise DFGError(f"{where}: node %{n.id} {n.op.value}: only mul, macc and gather "
                           f"select a lane of input 0, with lane >= 0 (got {n.lane})")
        if n.lane and n.op is Op.GATHER:
            src = self.nodes[n.inputs[0]]
            if src.op is not Op.LOAD or not src.addr.span or n.lane >= src.addr.span:
                raise DFGError(f"{where}: node %{n.id} gather selects lane {n.lane} of its "
                               "index: the index must be a row load spanning that lane")
        if n.hold and n.op is not Op.LOAD:
            raise DFGError(f"{where}: node %{n.id} {n.op.value}: only a load is held")

    def _verify_memory_node(self, where: str, n: Node) -> None:
        if n.buffer not in self.buffer_map or n.addr is None:
            raise DFGError(f"{where}: node %{n.id} needs a declared buffer and an address")
        loop_vars = [lp.var for lp in self.loops]
        for v, _ in n.addr.terms:
            if v not in loop_vars:
                raise DFGError(f"{where}: node %{n.id} address uses unknown variable {v!r}")
        if n.addr.span and (self.vector_var is None or n.op is not Op.LOAD
                            or n.addr.span < 0):
            raise DFGError(f"{where}: node %{n.id}: a span (consecutive-word vector) is for "
                           "loads of a vectorised kernel")
        if n.op.is_indirect != bool(n.addr.index_stride):
            raise DFGError(f"{where}: node %{n.id}: only gather/scatter/scatter_acc use "
                           "an index")
        index_op = self.nodes[n.inputs[0]].op if n.op is Op.SCATTER_ACC else None
        if index_op is not None and index_op not in (Op.LOAD, Op.GATHER):
            # the run of same-address iterations (one read-modify-write per run) is
            # decided from the next iteration's address, so its index must be loaded
            raise DFGError(f"{where}: node %{n.id} scatter_acc needs a loaded index "
                           f"(load or gather), got {index_op.value}")

    def _verify_fetch(self, where: str) -> None:
        """fetch="gather" only for an input read only by gathers whose index is a load;
        "on_chip" for an unpitched input or output, "keep" for an unpitched input
        (`Program.verify` pairs them); `spm_base` only on those."""
        for b in self.buffers:
            if b.spm_base is not None and not b.held:
                raise DFGError(f"{where}: buffer {b.name!r}: spm_base is for a buffer held "
                               "on chip (fetch 'on_chip' or 'keep')")
            if b.fetch == BufferFetch.WHOLE:
                continue
            if b.held:
                if b.role == BufferRole.TEMP or b.pitch is not None or (
                        b.fetch == BufferFetch.KEEP and b.role != BufferRole.INPUT):
                    raise DFGError(f"{where}: buffer {b.name!r} fetch={str(b.fetch)!r} is for "
                                   "an unpitched input ('keep': an input) or output handed "
                                   "between kernels")
                continue
            if (b.fetch != BufferFetch.GATHER or b.role != BufferRole.INPUT
                    or not self._read_only_by_loaded_gathers(b)):
                raise DFGError(f"{where}: buffer {b.name!r} fetch={str(b.fetch)!r}: 'gather' is "
                               "for an input read only by gathers whose index is a load; else "
                               "'whole'")

    def _read_only_by_loaded_gathers(self, b: Buffer) -> bool:
        users = [n for n in self.nodes if n.buffer == b.name]
        return bool(users) and all(
            n.op is Op.GATHER and self.nodes[n.inputs[0]].op is Op.LOAD for n in users)

    def _verify_carried(self, where: str) -> None:
        """Carried edges join existing nodes at distance >= 1; no cycle of distance 0."""
        n_nodes = len(self.nodes)
        if any(s >= n_nodes or d >= n_nodes or dist < 1 for s, d, dist in self.carried):
            raise DFGError(f"{where}: carried edges need existing nodes and distance >= 1")
        # the distance-0 edges of `graph()`: the inputs, less a pair a carried edge replaces
        carried = {(s, d) for s, d, _ in self.carried}
        zero = {(i, n.id) for n in self.nodes for i in n.inputs if (i, n.id) not in carried}
        if _has_cycle(zero):
            raise DFGError(f"{where}: the body has a cycle of distance 0")

    def __str__(self) -> str:
        loops = " ".join(
            f"for {lp.var} in [0,{lp.extent})" if lp.is_dense
            else f"for {lp.var} in {lp.pos}[{lp.parent}]..{lp.pos}[{lp.parent}+1]"
            for lp in self.loops
        )
        body = "\n".join(f"    {n}" for n in self.nodes)
        vec = f"  (vector over {self.vector_var})" if self.vector_var else ""
        return f"kernel {self.name}: {loops}{vec}\n{body}"


def _has_cycle(edges: set[tuple[int, int]]) -> bool:
    """Whether the directed graph of `edges` has a cycle (Kahn: a node set that never runs out
    of predecessors is left over)."""
    preds: dict[int, int] = {}
    succs: dict[int, list[int]] = {}
    for u, v in edges:
        preds.setdefault(u, 0)
        preds[v] = preds.get(v, 0) + 1
        succs.setdefault(u, []).append(v)
    ready = [u for u, k in preds.items() if k == 0]
    for u in ready:  # grows while it is walked
        for v in succs.get(u, ()):
            preds[v] -= 1
            if preds[v] == 0:
                ready.append(v)
    return len(ready) < len(preds)


def vector_nodes(kernel: Kernel) -> frozenset[int]:
    """Nodes whose value is a SIMD vector: memory nodes addressed by the vector variable or
    spanning consecutive words, and nodes computed from a vector by an op that keeps its
    lanes (`Op.inherits_lanes`; a vsum's value is a scalar; a selected lane is a scalar). The
    one rule for the mapper's link flits and the engines' lanes."""
    vec: set[int] = set()
    if kernel.vector_var is None:
        return frozenset()
    for n in kernel.nodes:
        addressed = n.addr is not None and (n.addr.coef(kernel.vector_var) != 0
                                            or n.addr.span > 0)
        # a selected lane is a scalar: only the other inputs can make the node a vector
        lanes_in = n.inputs[1:] if n.lane is not None else n.inputs
        if addressed or (n.op.inherits_lanes and any(i in vec for i in lanes_in)):
            vec.add(n.id)
    return frozenset(vec)


@dataclass(frozen=True)
class GemmShape:
    """C[m, n] = A[m, k] @ B[k, n]: a program that is one dense GEMM (a systolic array's work).
    `a_addresses`: the m x k addresses of A's elements in memory when several elements are one
    word (a convolution's im2col repeats input pixels; -1 for padding); None when each element
    is its own word. The systolic memory model fetches by address."""

    m: int
    n: int
    k: int
    a_addresses: np.ndarray | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class StageGroup:
    """Stages first .. first + count - 1 in one kernel."""

    first: int
    count: int

    @property
    def last(self) -> int:
        return self.first + self.count - 1


@dataclass(frozen=True, eq=False)
class Program:
    """A DAG of kernels joined by the buffers they produce and consume.

    `inputs` hold the data of input buffers (flat numpy arrays, by name); `outputs` name the
    buffers that are the program's results, with their logical shapes. `gemm` is set when the
    program is one dense GEMM (the systolic mapper needs its shape); `stage_groups` are the
    stages of a staged transform (a butterfly) each kernel computes, in kernel order.
    """

    name: str
    kernels: tuple[Kernel, ...]
    inputs: tuple[tuple[str, np.ndarray], ...]
    outputs: tuple[tuple[str, tuple[int, ...]], ...]
    dtype: str = "float32"
    macs: int = 0  # useful multiply-accumulates, for utilisation and rooflines
    gemm: GemmShape | None = None
    stage_groups: tuple[StageGroup, ...] = ()
    # (buffer, columns, row pitch): an output stored with rows `pitch` words apart, of which
    # the first `columns` are its values (`dfg.layout.pitch_output_rows`)
    output_pitch: tuple[tuple[str, int, int], ...] = ()
    # values of buffers an earlier kernel makes that the host knows before the run (a run-time
    # index whose prefix sum the host computes): the compiler measures a later kernel's timing
    # with them (`plan.compile`); the engines never read them
    known: tuple[tuple[str, np.ndarray], ...] = ()
    # (buffer, order): an output written at the positions of a sparse operand whose nonzeros
    # run in another order, position s holding nonzero order[s]
    # (`plan.gather_lines.line_order`, docs/conventions.md#gather-lines)
    output_order: tuple[tuple[str, np.ndarray], ...] = ()
    # (buffer, words): an input the compiler padded (explicit zeros, `dfg.nonzero_unroll`)
    # whose compulsory words are the unpadded operand's -- the roofline counts those, never
    # the pads (docs/conventions.md#roofline-and-compulsory-bytes)
    useful_words: tuple[tuple[str, int], ...] = ()

    def __hash__(self) -> int:
        return id(self)

    def logical_output(self, name: str, flat: np.ndarray) -> np.ndarray:
        """Output buffer `name`'s words `flat` (as the array holds them) in its logical,
        row-major order: a pitched output loses the words past each row's columns; an ordered
        one goes back to its nonzeros' order."""
        for buf, cols, pitch in self.output_pitch:
            if buf == name:
                return flat.reshape(-1, pitch)[:, :cols].ravel()
        for buf, order in self.output_order:
            if buf == name:
                out = np.empty_like(flat)
                out[order] = flat
                return out
        return flat

    @cached_property
    def input_map(self) -> dict[str, np.ndarray]:
        return dict(self.inputs)

    def verify(self) -> None:
        produced = set(self.input_map)
        for k in self.kernels:
            k.verify()
            for b in k.buffers:
                if b.role == BufferRole.INPUT and b.name not in produced:
                    raise DFGError(f"program {self.name!r}: kernel {k.name!r} reads {b.name!r}, "
                                   "which no input or earlier kernel provides")
                if b.role == BufferRole.INPUT and b.name in self.input_map \
                        and self.input_map[b.name].size != b.size:
                    raise DFGError(f"program {self.name!r}: buffer {b.name!r} declared with "
                                   f"{b.size} words but given {self.input_map[b.name].size}")
            produced |= {b.name for b in k.buffers if b.role == BufferRole.OUTPUT}
        for name, _ in self.outputs:
            if name not in produced:
                raise DFGError(f"program {self.name!r}: output {name!r} is never produced")
        self._verify_on_chip()

    def _verify_on_chip(self) -> None:
        """A buffer read on chip was left on chip, at its size and SPM base, by the last
        kernel that wrote it or by a kernel that read it with "keep" since; one left on chip
        by its writer is read from DRAM by no later kernel and is not a program output
        (docs/conventions.md#moe-buffers-handed-over-in-the-spm)."""
        left: dict[str, Buffer] = {}  # what is on chip now, by the buffer that left it
        only_on_chip: set[str] = set()  # written on chip and never to DRAM since
        outputs = {name for name, _ in self.outputs}
        for k in self.kernels:
            for b in k.buffers:
                if b.role != BufferRole.INPUT:
                    continue
                made = left.get(b.name)
                if b.on_chip and (made is None or (made.size, made.spm_base)
                                  != (b.size, b.spm_base)):
                    raise DFGError(f"program {self.name!r}: kernel {k.name!r} reads {b.name!r} "
                                   "on chip, but no earlier kernel leaves it there at "
                                   f"{b.size} words (spm_base {b.spm_base})")
                if not b.on_chip and b.name in only_on_chip:
                    raise DFGError(f"program {self.name!r}: kernel {k.name!r} reads {b.name!r} "
                                   "from DRAM, but the kernel that makes it leaves it on chip")
                if b.fetch == BufferFetch.KEEP:
                    left[b.name] = b
            for b in k.buffers:
                if b.role == BufferRole.OUTPUT:
                    if b.on_chip and b.name in outputs:
                        raise DFGError(f"program {self.name!r}: output {b.name!r} must reach "
                                       "DRAM; it cannot be left on chip")
                    if b.on_chip:
                        left[b.name] = b
                        only_on_chip.add(b.name)
                    else:
                        left.pop(b.name, None)
                        only_on_chip.discard(b.name)
