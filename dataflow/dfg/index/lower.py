"""The generic lowering: index notation plus level formats -> one `Kernel` (TACO's code
generation, docs/architecture.md#the-generic-lowering).

- The iterated (driving) tensor is the one sparse factor; its levels become loops, outermost
  level first (`coords.walk_levels`): dense and range levels dense loops, a compressed level a
  loop over its positions, a singleton level a coordinate load. Index variables no level
  iterates are dense loops. Every other tensor is located: read at the coordinates the loops
  give, an affine load, or a gather when a coordinate is a loaded one (PIT's SRead).
- The output is located too (an accumulate, or a scatter-accumulate at a loaded coordinate),
  or, when its format is the driver's, written at the driver's position (a sampled result:
  SDDMM).
- Co-iterating two sparse operands (element-wise statements) merges their structures
  (`merge.coiterate`) and iterates the merge.
- Loops run in the caller's order of index variables (default: the output's, then the
  reductions), a compressed loop after its parent. The vector loop is the innermost dense loop
  that is not the outermost, that every access steps through contiguously (or not at all), that
  the output moves along (a reduction's lanes would need a cross-lane sum) and that no sparse
  loop or coordinate load depends on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dataflow.dfg.graph import Addr, Buffer, DFGError, Kernel, Loop, Node
from dataflow.dfg.index.coords import Coord, LevelLoop, crd_names, locate, walk_levels
from dataflow.dfg.index.merge import Coiteration, EwOperand, coiterate, merge_kernel
from dataflow.dfg.index.notation import Combine, Statement, parse_statement
from dataflow.dfg.index.tensors import LevelExpr, LevelKind, TensorLevels, dense
from dataflow.dfg.ops import Op

AUTO = "auto"  # `vector=AUTO`: choose the vector loop as the module doc says
#: `order=CONCORDANT`: the driver's levels outermost first (TACO's concordant iteration), then
#: the other index variables in the default order
CONCORDANT = "concordant"


@dataclass(frozen=True, eq=False)
class IndexLowering:
    """A lowered statement: the kernel, the tensor each buffer holds (`sources`: buffer ->
    (tensor, "val" or the crd level)), the zero padding of located tensors (`pads`: tensor ->
    words before each dimension's coordinate 0, and as many after) and the statement."""

    kernel: Kernel
    statement: Statement
    sources: tuple[tuple[str, tuple[str, str]], ...]
    pads: tuple[tuple[str, tuple[int, ...]], ...] = ()
    driver: str | None = None
    iterations: int = 0  # elements the loop nest visits (the vector loop counted in elements)
    coiteration: Coiteration | None = None  # an element-wise statement's merge


def extents_of(stmt: Statement, tensors: Mapping[str, TensorLevels]) -> dict[str, int]:
    """Each index variable's extent, checked to agree across the accesses."""
    ext: dict[str, int] = {}
    for acc in (stmt.output, *stmt.factors):
        t = tensors.get(acc.tensor)
        if t is None:
            raise DFGError(f"{stmt}: no levels given for tensor {acc.tensor!r}")
        if len(t.shape) != len(acc.indices):
            raise DFGError(f"{stmt}: {acc.tensor} has {len(t.shape)} dimensions, accessed "
                           f"with {len(acc.indices)} indices")
        for v, n in zip(acc.indices, t.shape):
            if ext.setdefault(v, int(n)) != n:
                raise DFGError(f"{stmt}: index {v!r} has extent {ext[v]} and {n} "
                               f"(in {acc.tensor})")
    return ext


def _order_loops(stmt: Statement, loops: dict[str, list[LevelLoop]],
                 order: Sequence[str] | None) -> list[LevelLoop]:
    """The loops in the order of index variables `order` (default: output, then reductions),
    each variable's loops in level order. A default order moves a compressed loop's parent
    ahead of it; a given order that puts a loop before its parent raises."""
    explicit = order is not None
    order = tuple(order) if explicit else (*stmt.output.indices, *stmt.reduction_vars)
    if sorted(order) != sorted(stmt.index_vars):
        raise DFGError(f"{stmt}: loop order {list(order)} is not a permutation of the index "
                       f"variables {list(stmt.index_vars)}")
    seq = [ll for v in order for ll in loops[v]]
    by_var = {ll.loop.var: ll for ll in seq}
    placed: list[LevelLoop] = []

    def place(ll: LevelLoop) -> None:
        if ll in placed:
            return
        parent = ll.loop.parent
        if parent is not None and by_var[parent] not in placed:
            if explicit:
                raise DFGError(f"{stmt}: loop order {list(order)} puts loop {ll.loop.var!r} "
                               f"(index {ll.index_var}) before its parent loop {parent!r}")
            place(by_var[parent])
        placed.append(ll)

    for ll in seq:
        place(ll)
    return placed


def _pick_vector(loops: list[LevelLoop], addrs: list[Addr], out: Addr,
                 scalar_addrs: list[Addr]) -> str | None:
    """The innermost loop the module doc's rule admits as the vector loop, one of more than
    one iteration when there is one (a matrix-vector product's extent-1 column loop is
    admitted only when nothing else is), or None."""
    parents = {ll.loop.parent for ll in loops}
    admitted = []
    for ll in reversed(loops[1:]):
        var = ll.loop.var
        if ll.positions or not ll.loop.is_dense or var in parents:
            continue
        if out.coef(var) != 1 or any(a.coef(var) not in (0, 1) for a in addrs):
            continue
        if any(a.coef(var) for a in scalar_addrs):
            continue
        admitted.append(ll.loop)
    wide = [lp for lp in admitted if lp.extent > 1]
    chosen = wide or admitted
    return chosen[0].var if chosen else None


class _Body:
    """Nodes and buffers (in order of first use) of the body being built."""

    def __init__(self):
        self.nodes: list[Node] = []
        self.buffers: dict[str, Buffer] = {}

    def add(self, op: Op, inputs=(), **kw) -> int:
        self.nodes.append(Node(len(self.nodes), op, tuple(inputs), **kw))
        return len(self.nodes) - 1

    def buffer(self, name: str, size: int, role: str = "input") -> None:
        if name in self.buffers and self.buffers[name].size != size:
            raise DFGError(f"buffer {name!r} declared with {self.buffers[name].size} and "
                           f"{size} words")
        self.buffers.setdefault(name, Buffer(name, size, role))


def _sampled(stmt: Statement, tensors, driver: str | None) -> bool:
    """The output is sparse with the driver's format and indices: written at its positions."""
    out = tensors[stmt.output.tensor]
    if not out.sparse:
        return False
    if driver == stmt.output.tensor:  # the output's own structure drives the loops
        return True
    d = tensors[driver] if driver else None
    ok = d is not None and out.levels == d.levels and \
        stmt.output.indices == next(f.indices for f in stmt.factors if f.tensor == driver)
    if not ok:
        raise DFGError(f"{stmt}: a sparse output needs the format and indices of the sparse "
                       "operand it samples (assembling a new structure is not supported)")
    return True


def _pads(stmt: Statement, tensors, coords: dict[str, Coord], extents: dict[str, int],
          driver: str | None) -> dict[str, tuple[int, ...]]:
    """Zero padding each located factor needs so that every coordinate the loops reach is in
    its buffer (a diagonal's j = i + offset runs past the edges)."""
    pads = {}
    for f in stmt.factors:
        if f.tensor == driver:
            continue
        pad = []
        for v, n in zip(f.indices, tensors[f.tensor].shape):
            lo, hi = coords[v].bounds(extents)
            pad.append(max(0, -lo, hi - (n - 1)))
        if any(pad):
            pads[f.tensor] = tuple(pad)
    return pads


def _check_output_bounds(stmt: Statement, tensors, coords: dict[str, Coord],
                         extents: dict[str, int]) -> None:
    """Every coordinate the output is written at lies inside it (a diagonal format whose
    range level is the column, DIAJ, reaches rows past the edges at its filler)."""
    out = stmt.output
    for v, n in zip(out.indices, tensors[out.tensor].shape):
        lo, hi = coords[v].bounds(extents)
        if lo < 0 or hi > n - 1:
            raise DFGError(f"{stmt}: output index {v!r} reaches [{lo}, {hi}] outside "
                           f"[0, {n - 1}] (a format whose filler runs past the edges)")


def _loop_extents(loops: list[LevelLoop], domain: dict[str, np.ndarray]) -> dict[str, int]:
    """Each loop's extent; a position loop's is its pos array's last entry (an upper bound)."""
    return {ll.loop.var: ll.loop.extent if ll.loop.is_dense else int(domain[ll.loop.pos][-1])
            for ll in loops}


def lower_index(statement: str | Statement, tensors: Mapping[str, TensorLevels],
                order: Sequence[str] | None = None, vector: str | None = AUTO,
                name: str = "index", coiteration: Coiteration | None = None) -> IndexLowering:
    """Lower `statement` over `tensors` (name -> `TensorLevels`; an output left out is dense,
    row-major) into one kernel named `name`. `order`: the index variables outermost first
    (see `_order_loops`), or CONCORDANT. `vector`: AUTO, None (scalar) or the loop variable to
    vectorise.
    `coiteration`: an element-wise statement's merge, to reuse (else computed here)."""
    stmt = parse_statement(statement) if isinstance(statement, str) else statement
    tensors = dict(tensors)
    if stmt.output.tensor not in tensors:
        sizes: dict[str, int] = {}
        for f in stmt.factors:
            if f.tensor in tensors:
                for v, n in zip(f.indices, tensors[f.tensor].shape):
                    sizes.setdefault(v, n)
        tensors[stmt.output.tensor] = dense([sizes.get(v, 0) for v in stmt.output.indices])
    ext = extents_of(stmt, tensors)
    sparse = [f for f in stmt.factors if tensors[f.tensor].sparse]
    if stmt.elementwise and sparse:
        return _lower_merge(stmt, tensors, name, coiteration)
    if len(sparse) > 1:
        raise DFGError(f"{stmt}: {sparse[0].tensor} and {sparse[1].tensor} are both sparse; a "
                       "product of sparse operands lowers with lower_spgemm (Gustavson)")
    # no sparse operand: a sparse output with its structure given drives (pattern-only SDDMM)
    out_sparse = tensors[stmt.output.tensor].sparse
    drv = sparse[0] if sparse else (stmt.output if out_sparse else None)
    return _lower_iterated(stmt, tensors, ext, drv, order, vector, name)


def index_kernel(statement: str | Statement, tensors: Mapping[str, TensorLevels],
                 order: Sequence[str] | None = None, vector: str | None = AUTO,
                 name: str = "index") -> Kernel:
    """`lower_index(...).kernel`: the kernel alone (the hand-written kernels' replacement)."""
    return lower_index(statement, tensors, order, vector, name).kernel


def _lower_iterated(stmt: Statement, tensors: dict[str, TensorLevels], ext: dict[str, int],
                    drv, order, vector, name: str) -> IndexLowering:
    """The loops of the driver's levels and the dense index variables, the located reads, the
    product or sum, the output (module doc)."""
    taken = set(stmt.index_vars)
    domain: dict[str, np.ndarray] = {}
    loops: dict[str, list[LevelLoop]] = {v: [] for v in stmt.index_vars}
    coords: dict[str, Coord] = {}
    driver = drv.tensor if drv is not None else None
    position = Coord()
    if drv is not None:
        w = walk_levels(driver, tensors[driver], drv.indices, taken, domain)
        for ll in w.loops:
            loops[ll.index_var].append(ll)
        coords = {drv.indices[d]: c for d, c in w.dims.items()}
        position = w.position
    for v in stmt.index_vars:
        if v not in coords:
            loops[v].append(LevelLoop(Loop(v, ext[v]), v))
            coords[v] = Coord.var(v)
    if order == CONCORDANT:
        first = list(dict.fromkeys(ll.index_var for ll in (w.loops if drv is not None else ())))
        order = None if not first else (*first, *(
            v for v in (*stmt.output.indices, *stmt.reduction_vars) if v not in first))
    ordered = _order_loops(stmt, loops, order)
    extents = _loop_extents(ordered, domain)
    pads = _pads(stmt, tensors, coords, extents, driver)
    _check_output_bounds(stmt, tensors, coords, extents)
    sampled = _sampled(stmt, tensors, driver)
    out_at = position if sampled else locate(stmt.output.tensor, tensors[stmt.output.tensor],
                                             stmt.output.indices, coords)
    reads = {f.tensor: position if f.tensor == driver else
             locate(f.tensor, tensors[f.tensor], f.indices, coords, pads.get(f.tensor))
             for f in stmt.factors}
    if vector == AUTO:
        crd_at = [c.loaded.at.addr() for c in (*reads.values(), out_at) if c.loaded is not None]
        vector = _pick_vector(ordered, [c.addr() for c in reads.values()], out_at.addr(),
                              crd_at)
    body = _Body()
    _emit(body, stmt, tensors, driver, reads, out_at, sampled, pads)
    acc_nodes = [n.id for n in body.nodes if n.op.accumulates]
    kernel = Kernel(name=name, loops=tuple(ll.loop for ll in ordered), nodes=tuple(body.nodes),
                    buffers=tuple(body.buffers.values()), vector_var=vector,
                    domain_arrays=tuple((ll.loop.pos, domain[ll.loop.pos]) for ll in ordered
                                        if not ll.loop.is_dense),
                    carried=tuple((i, i, 1) for i in acc_nodes))
    kernel.verify()
    iterated = set(drv.indices) if drv is not None else set()
    others = [ext[v] for v in stmt.index_vars if v not in iterated]
    iters = (tensors[driver].stored if driver else 1) * int(np.prod(others, dtype=np.int64))
    return IndexLowering(kernel, stmt, _sources(stmt, tensors, driver), tuple(pads.items()),
                         driver, iters)


def _located_size(t: TensorLevels, pad: tuple[int, ...] | None) -> int:
    size = 1
    for lv in t.levels:
        lead = pad[lv.expr.dim] if pad is not None and not lv.expr.op else 0
        size *= lv.size + 2 * lead
    return size


def _emit(body: _Body, stmt: Statement, tensors, driver, reads: dict[str, Coord], out_at: Coord,
          sampled: bool, pads) -> None:
    """The body: the driver's value load, one coordinate load per use, the located reads in
    statement order, the left-associated product or sum, the output's write."""
    vals: dict[str, int] = {}
    if driver and driver != stmt.output.tensor:
        t = tensors[driver]
        buf = t.buffer or f"{driver}_val"
        body.buffer(buf, t.stored)
        vals[driver] = body.add(Op.LOAD, buffer=buf, addr=reads[driver].addr(),
                                name=f"{driver}.val")
    out = stmt.output.tensor
    crd_for: dict[str, int] = {}
    for use, c in [*reads.items(), (f"{out}=", out_at)]:
        if use != driver and c.loaded is not None:
            ld = c.loaded
            body.buffer(ld.buffer, ld.size)
            crd_for[use] = body.add(Op.LOAD, buffer=ld.buffer, addr=ld.at.addr(), name=ld.buffer)
    for f in stmt.factors:
        if f.tensor == driver:
            continue
        t, c = tensors[f.tensor], reads[f.tensor]
        buf = t.buffer or f.tensor
        body.buffer(buf, _located_size(t, pads.get(f.tensor)))
        if c.affine:
            vals[f.tensor] = body.add(Op.LOAD, buffer=buf, addr=c.addr(), name=f.tensor.lower())
        else:
            vals[f.tensor] = body.add(Op.GATHER, (crd_for[f.tensor],), buffer=buf,
                                      addr=c.addr(), name=f"{buf}[crd]")
    op = Op.MUL if stmt.combine is Combine.PRODUCT else Op.ADD
    value = vals[stmt.factors[0].tensor]
    for f in stmt.factors[1:]:
        value = body.add(op, (value, vals[f.tensor]), name=op.value)
    acc = bool(stmt.reduction_vars) or stmt.accumulate
    ot = tensors[out]
    if sampled:
        obuf = ot.buffer or f"{out}_val"
        body.buffer(obuf, tensors[driver].stored, "output")
    else:
        obuf = ot.buffer or out
        body.buffer(obuf, _located_size(ot, None), "output")
    label = f"{out}{'+=' if acc else '='}"
    if out_at.affine:
        body.add(Op.ACC if acc else Op.STORE, (value,), buffer=obuf, addr=out_at.addr(),
                 name=label)
    else:
        body.add(Op.SCATTER_ACC if acc else Op.SCATTER, (crd_for[f"{out}="], value),
                 buffer=obuf, addr=out_at.addr(), name=label)


def _sources(stmt: Statement, tensors, driver) -> tuple[tuple[str, tuple[str, str]], ...]:
    """buffer -> (tensor, "val" or "crd{k}") for every input buffer."""
    out = []
    for f in stmt.factors:
        t = tensors[f.tensor]
        if f.tensor == driver:
            out.append((t.buffer or f"{f.tensor}_val", (f.tensor, "val")))
            out += [(crd, (f.tensor, f"crd{k}"))
                    for k, (crd, _) in crd_names(f.tensor, t).items()]
        else:
            out.append((t.buffer or f.tensor, (f.tensor, "val")))
    if driver == stmt.output.tensor:
        out += [(crd, (driver, f"crd{k}")) for k, (crd, _) in
                crd_names(driver, tensors[driver]).items()]
    return tuple(out)


def _as_ew(name: str, t: TensorLevels) -> EwOperand:
    """A 2-D operand as the merge reads it: row-major dense or CSR."""
    lv = t.levels
    if len(t.shape) == 2 and not t.sparse and [x.expr for x in lv] == [LevelExpr(0), LevelExpr(1)]:
        return EwOperand(np.asarray(t.val) if t.val is not None else np.zeros(t.stored))
    if len(t.shape) == 2 and [(x.kind, x.expr) for x in lv] == [
            (LevelKind.DENSE, LevelExpr(0)), (LevelKind.COMPRESSED, LevelExpr(1))]:
        crd = t.level_crd(1)
        val = np.asarray(t.val) if t.val is not None else np.zeros(len(crd))
        return EwOperand(val, t.level_pos(1), crd)
    raise DFGError(f"co-iteration takes CSR or row-major dense matrices; {name} is neither "
                   "(convert it first)")


def _lower_merge(stmt: Statement, tensors, name: str, co: Coiteration | None) -> IndexLowering:
    """An element-wise statement with a sparse operand: the merge, then one loop over it."""
    if len(stmt.factors) != 2:
        raise DFGError(f"{stmt}: co-iteration merges two operands, got {len(stmt.factors)}")
    kind = "add" if stmt.combine is Combine.SUM else "multiply"
    a, b = (_as_ew(f.tensor, tensors[f.tensor]) for f in stmt.factors)
    out = tensors[stmt.output.tensor]
    co = co or coiterate(kind, tuple(out.shape), a, b)
    sizes = tuple(x.val.size + (mp is not None) for x, mp in zip((a, b), co.maps))
    names = tuple(tensors[t].buffer or t for t in (*(f.tensor for f in stmt.factors),
                                                    stmt.output.tensor))
    kernel = merge_kernel(kind, co, (a.is_dense, b.is_dense), sizes, out.sparse, names, name)
    kernel.verify()
    return IndexLowering(kernel, stmt, (), (), None, co.nnz, co)
