"""Schedule transformations over the kernel IR: each takes a `Kernel` (or a `Program`, where
the data layout changes with it) and returns a new one computing the same values
(docs/conventions.md#register-blocking). The planning stage (`dataflow.plan.compile`) chooses
which to apply and with what factors; this module knows no architecture.

- `fuse_multiply_accumulate`: a `mul` whose one user is an `acc` becomes one `macc`, so the
  product accumulates in the multiplier PE's register (no second PE, no value on a link);
- `unroll_and_jam`: a loop split by a factor whose copies of the body run side by side in one
  iteration (register blocking: a loaded value that does not depend on the loop feeds every
  copy, so one load serves several MACs);
- data layouts (`pack_panels`, `pack_column_panels`, `pad_rows`, `pitch_output_rows`) are
  program passes of their own, in `dataflow.dfg.layout`;
- `vectorise_lanes`: scalar loads of consecutive words become one row load (`Addr.span`), each
  user taking its lane (`Node.lane`): the column operand of an outer product;
- `split`, `reorder`, `vectorise_reduction` (the loop-nest block at the end): strip-mine a loop,
  permute the loops where legal, make a reduction loop the vector loop with a lane sum before
  each accumulation (docs/conventions.md#generic-lowering);
- `hold_invariant_loads`: a load whose address does not move with the innermost loop is held
  in its PE's register, the SPM read again only when the address changes
  (docs/conventions.md#held-loads).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from dataflow.dfg.graph import Addr, DFGError, Kernel, Loop, Node, Program, vector_nodes
from dataflow.dfg.ops import Op


def users_of(kernel: Kernel) -> dict[int, list[int]]:
    """Each node's id -> the ids of the body nodes that take it as an input."""
    users: dict[int, list[int]] = {n.id: [] for n in kernel.nodes}
    for n in kernel.nodes:
        for i in n.inputs:
            users[i].append(n.id)
    return users


def _renumber(kernel: Kernel, nodes: list[Node], carried) -> Kernel:
    """`nodes` (with their old ids, inputs naming old ids) renumbered 0..n-1 in list order."""
    remap = {n.id: new for new, n in enumerate(nodes)}
    out = tuple(dataclasses.replace(n, id=remap[n.id], inputs=tuple(remap[i] for i in n.inputs))
                for n in nodes)
    carried = tuple((remap[s], remap[d], dist) for s, d, dist in carried)
    return dataclasses.replace(kernel, nodes=out, carried=carried)


def fuse_multiply_accumulate(kernel: Kernel) -> Kernel:
    """Every `mul` used only by an `acc` merges into it: one `macc` with the mul's inputs (and
    selected lane) at the acc's buffer and address. The acc's register recurrence stays."""
    users = users_of(kernel)
    carried_nodes = {s for s, _, _ in kernel.carried} | {d for _, d, _ in kernel.carried}
    fused: dict[int, Node] = {}  # acc id -> its macc
    dropped: set[int] = set()
    for n in kernel.nodes:
        if n.op is not Op.ACC or n.addr.index_stride:
            continue
        src = kernel.nodes[n.inputs[0]]
        if src.op is Op.MUL and users[src.id] == [n.id] and src.id not in carried_nodes:
            fused[n.id] = dataclasses.replace(n, op=Op.MACC, inputs=src.inputs, lane=src.lane,
                                              name=f"{src.name or 'mul'}+={n.buffer}")
            dropped.add(src.id)
    if not fused:
        return kernel
    nodes = [fused.get(n.id, n) for n in kernel.nodes if n.id not in dropped]
    return _renumber(kernel, nodes, kernel.carried)


def depends_on(kernel: Kernel, var: str) -> set[int]:
    """Nodes whose address uses `var`, and every node computed from one of them."""
    dep: set[int] = set()
    for n in kernel.nodes:
        if (n.addr is not None and n.addr.coef(var)) or any(i in dep for i in n.inputs):
            dep.add(n.id)
    return dep


def _shifted(addr: Addr, var: str, factor: int, offset: int, inner: bool) -> Addr:
    """`addr` with `var` replaced by factor*var + offset (inner) or var + offset (outer)."""
    c = addr.coef(var)
    terms = tuple((v, cf * factor if inner and v == var else cf) for v, cf in addr.terms)
    return dataclasses.replace(addr, terms=terms, const=addr.const + c * offset)


def unroll_and_jam(kernel: Kernel, var: str, factor: int, inner: bool = True) -> Kernel:
    """Split loop `var` (extent E, a multiple of `factor`) into E / factor iterations whose body
    holds `factor` copies of every node that depends on `var`; copy u computes the original
    iteration factor*v + u (`inner`: neighbouring rows, as a register block) or v + u*E/factor
    (outer: blocks E / factor apart, the way a vector loop splits). Nodes that do not depend on
    `var` stay single and feed every copy."""
    where = f"kernel {kernel.name!r}: unroll_and_jam({var!r}, {factor})"
    loops = {lp.var: lp for lp in kernel.loops}
    lp = loops.get(var)
    if lp is None or not lp.is_dense or any(x.parent == var for x in kernel.loops):
        raise DFGError(f"{where}: needs a dense loop no sparse loop hangs off")
    if factor < 1 or lp.extent % factor:
        raise DFGError(f"{where}: extent {lp.extent} is not a multiple of {factor}")
    if inner and var == kernel.vector_var and factor > 1:
        raise DFGError(f"{where}: a vector loop splits into outer blocks (inner=False)")
    if factor == 1:
        return kernel
    step = 1 if inner else lp.extent // factor
    dep = depends_on(kernel, var)
    copies: dict[tuple[int, int], Node] = {}  # (old id, u) -> node with a fresh old-style id
    nodes: list[Node] = []
    next_id = len(kernel.nodes)
    for n in kernel.nodes:
        if n.id not in dep:
            nodes.append(n)
            for u in range(factor):
                copies[(n.id, u)] = n
            continue
        for u in range(factor):
            ins = tuple(copies[(i, u)].id for i in n.inputs)
            addr = None if n.addr is None else _shifted(n.addr, var, factor, u * step, inner)
            new = dataclasses.replace(n, id=next_id, inputs=ins, addr=addr,
                                      name=f"{n.name}[{var}+{u * step}]")
            next_id += 1
            nodes.append(new)
            copies[(n.id, u)] = new
    carried = tuple((copies[(s, u)].id, copies[(d, u)].id, dist)
                    for s, d, dist in kernel.carried
                    for u in (range(factor) if s in dep or d in dep else (0,)))
    new_loops = tuple(Loop(x.var, x.extent // factor) if x.var == var else x
                      for x in kernel.loops)
    return _renumber(dataclasses.replace(kernel, loops=new_loops), nodes, carried)


def vectorise_lanes(kernel: Kernel, width: int) -> Kernel:
    """Groups of `width` scalar loads of one buffer at consecutive words base + 0 .. width - 1
    (base and every coefficient multiples of `width`, so the group is one aligned row), each
    used only as an operand of mul or macc, become one row load (`Addr.span = width`); every
    user takes its lane of it as input 0 (`Node.lane`; mul and macc commute)."""
    users = users_of(kernel)
    groups: dict[tuple, dict[int, Node]] = {}
    for n in kernel.nodes:
        if n.op is not Op.LOAD or n.addr.span or n.addr.index_stride or \
                (kernel.vector_var and n.addr.coef(kernel.vector_var)):
            continue
        if not all(kernel.nodes[u].op.selects_lane and kernel.nodes[u].lane is None
                   for u in users[n.id]):
            continue
        base = n.addr.const - n.addr.const % width
        if any(c % width for _, c in n.addr.terms):
            continue
        groups.setdefault((n.buffer, n.addr.terms, base), {})[n.addr.const - base] = n
    merged: dict[int, tuple[int, int]] = {}  # old load id -> (row load id, lane)
    rows: dict[int, Node] = {}
    for (_, terms, base), members in groups.items():
        if sorted(members) != list(range(width)):
            continue
        first = members[0]
        rows[first.id] = dataclasses.replace(first, addr=Addr(terms, base, span=width),
                                             name=f"{first.buffer}[row]")
        for lane, n in members.items():
            merged[n.id] = (first.id, lane)
    if not merged or any(sum(i in merged for i in n.inputs) > 1 for n in kernel.nodes):
        return kernel  # nothing to merge, or a product of two lanes (left as it is)
    nodes = []
    for n in kernel.nodes:
        if n.id in merged:
            if n.id in rows:
                nodes.append(rows[n.id])
            continue
        hit = [k for k, i in enumerate(n.inputs) if i in merged]
        if hit:
            k = hit[0]
            row, lane = merged[n.inputs[k]]
            other = tuple(i for j, i in enumerate(n.inputs) if j != k)
            n = dataclasses.replace(n, inputs=(row, *other), lane=lane)
        nodes.append(n)
    return _renumber(kernel, nodes, kernel.carried)



# --- loop-nest passes: split and reorder (the generic lowering's schedules) ----------------------

def _fresh_loop_name(kernel: Kernel, base: str) -> str:
    taken = {lp.var for lp in kernel.loops}
    name, k = base, 1
    while name in taken:
        name, k = f"{base}{k}", k + 1
    return name


def split(kernel: Kernel, var: str, factor: int, outer: str | None = None,
          inner: str | None = None) -> Kernel:
    """Strip-mine dense loop `var` (extent E, a multiple of `factor`) into `outer` (E / factor
    iterations, default `var`o) and `inner` (`factor`, default `var`i), var = factor * outer +
    inner: the same iterations in the same order, so the values are the same bit for bit. The
    vector loop's inner half stays the vector loop (a factor that is a multiple of the SIMD
    lanes keeps every vector full). A loop a sparse loop hangs off cannot split (its pos array
    is indexed by the loop variable)."""
    where = f"kernel {kernel.name!r}: split({var!r}, {factor})"
    loops = {lp.var: lp for lp in kernel.loops}
    lp = loops.get(var)
    if lp is None or not lp.is_dense:
        raise DFGError(f"{where}: needs a dense loop of the kernel, got {var!r}")
    hanging = [x.var for x in kernel.loops if x.parent == var]
    if hanging:
        raise DFGError(f"{where}: sparse loop {hanging[0]!r} hangs off it")
    if factor < 1 or lp.extent % factor:
        raise DFGError(f"{where}: extent {lp.extent} is not a multiple of {factor}")
    outer = outer or _fresh_loop_name(kernel, f"{var}o")
    inner = inner or _fresh_loop_name(kernel, f"{var}i")
    if len({outer, inner} | (set(loops) - {var})) != len(loops) + 1:
        raise DFGError(f"{where}: loop names {outer!r}, {inner!r} are taken")

    def rewrite(addr: Addr | None) -> Addr | None:
        if addr is None or not addr.coef(var):
            return addr
        terms = []
        for v, c in addr.terms:
            terms += [(outer, c * factor), (inner, c)] if v == var else [(v, c)]
        return dataclasses.replace(addr, terms=tuple(terms))

    new_loops = []
    for x in kernel.loops:
        new_loops += [Loop(outer, x.extent // factor), Loop(inner, factor)] if x.var == var \
            else [x]
    nodes = tuple(dataclasses.replace(n, addr=rewrite(n.addr)) for n in kernel.nodes)
    out = dataclasses.replace(kernel, loops=tuple(new_loops), nodes=nodes,
                              vector_var=inner if kernel.vector_var == var else kernel.vector_var)
    out.verify()
    return out


def _injective(addr: Addr, extents: dict[str, int]) -> bool:
    """Whether an affine address takes a distinct value at every point of the loop variables'
    ranges that it and the other loops span: every loop of more than one iteration appears,
    and the coefficients, sorted by size, form a mixed radix (each larger than everything the
    smaller ones reach)."""
    coefs = {v: abs(addr.coef(v)) for v in extents}
    if any(extents[v] > 1 and not c for v, c in coefs.items()):
        return False
    reach = 0
    for v, c in sorted(coefs.items(), key=lambda vc: vc[1]):
        if extents[v] > 1 and c <= reach:
            return False
        reach += c * (extents[v] - 1)
    return True


def _check_reorder_dependences(kernel: Kernel, where: str) -> None:
    """What reordering may not break: a loop-carried value other than an accumulation's own
    register, and an overwrite that could hit one word from two iterations (the last write
    would change). Accumulations may reorder: a sum or maximum in another order (a sum's
    rounding may differ in the last bits)."""
    for s, d, _ in kernel.carried:
        if s != d or not kernel.nodes[s].op.accumulates:
            raise DFGError(f"{where}: the loop-carried edge %{s} -> %{d} ties the iteration "
                           "order")
    extents = {lp.var: lp.extent if lp.is_dense else int(kernel.domain[lp.pos][-1])
               for lp in kernel.loops}
    for n in kernel.nodes:
        if n.op in (Op.STORE, Op.SCATTER) and (n.addr.index_stride or
                                               not _injective(n.addr, extents)):
            raise DFGError(f"{where}: node %{n.id} {n.op.value} may write one word from two "
                           "iterations, whose order would change")


def reorder(kernel: Kernel, order) -> Kernel:
    """The loops permuted to `order` (loop variables, outermost first), where legal: a sparse
    loop after its parent, a dense loop outermost, the vector loop not outermost, and the
    dependences of `_check_reorder_dependences`. An illegal order raises DFGError naming the
    loop. The body is unchanged; accumulations see their terms in the new order."""
    where = f"kernel {kernel.name!r}: reorder({list(order)})"
    loops = {lp.var: lp for lp in kernel.loops}
    if sorted(order) != sorted(loops):
        raise DFGError(f"{where}: not a permutation of the loops {list(loops)}")
    if tuple(order) == tuple(loops):
        return kernel
    for k, v in enumerate(order):
        lp = loops[v]
        if k == 0 and not lp.is_dense:
            raise DFGError(f"{where}: loop {v!r} is sparse and cannot be outermost")
        if lp.parent is not None and lp.parent not in order[:k]:
            raise DFGError(f"{where}: loop {v!r} runs over the positions of {lp.parent!r} "
                           "and must come after it")
    if kernel.vector_var == order[0]:
        raise DFGError(f"{where}: loop {order[0]!r} is the vector loop and cannot be outermost")
    _check_reorder_dependences(kernel, where)
    out = dataclasses.replace(kernel, loops=tuple(loops[v] for v in order))
    out.verify()
    return out


def vectorise_reduction(kernel: Kernel, var: str) -> Kernel:
    """Make the reduction loop `var` the vector loop of a scalar kernel: each access steps
    along it contiguously (coefficient 1) or not at all, every accumulation's address is
    independent of it (it is their reduction), and a lane sum (`vsum`) is inserted before each
    accumulation, so one iteration does a whole vector of the reduction and the register adds
    its sum. `var`'s extent should be a multiple of the SIMD lanes (pad the operands with
    zeros), as `split(var, lanes)` makes the inner loop. Sums in another order: fp32
    tolerances."""
    where = f"kernel {kernel.name!r}: vectorise_reduction({var!r})"
    lp = next((x for x in kernel.loops if x.var == var), None)
    if kernel.vector_var is not None:
        raise DFGError(f"{where}: the kernel already vectorises {kernel.vector_var!r}")
    if lp is None or not lp.is_dense or lp is kernel.loops[0] or \
            any(x.parent == var for x in kernel.loops):
        raise DFGError(f"{where}: needs a dense loop, not the outermost, no sparse loop off it")
    for n in kernel.nodes:
        if n.addr is None:
            continue
        c = n.addr.coef(var)
        if n.op.accumulates and (c or n.op not in (Op.ACC, Op.SCATTER_ACC)):
            raise DFGError(f"{where}: node %{n.id} {n.op.value} is not a sum over {var!r}")
        if n.op in (Op.STORE, Op.SCATTER) or c not in (0, 1) or (c and n.addr.span):
            raise DFGError(f"{where}: node %{n.id} {n.op.value} does not step along {var!r} "
                           "contiguously")
        index = kernel.nodes[n.inputs[0]] if n.op.is_indirect else None
        if index is not None and index.addr is not None and index.addr.coef(var):
            raise DFGError(f"{where}: node %{n.id}'s index moves with {var!r} (a vector of "
                           "indices)")
    nodes: list[Node] = []
    next_id = len(kernel.nodes)
    for n in kernel.nodes:
        if n.op.accumulates:
            value = n.inputs[-1]
            total = Node(next_id, Op.VSUM, (value,), name=f"sum {var} lanes")
            next_id += 1
            nodes.append(total)
            n = dataclasses.replace(n, inputs=(*n.inputs[:-1], total.id))
        nodes.append(n)
    out = _renumber(dataclasses.replace(kernel, vector_var=var), nodes, kernel.carried)
    out.verify()
    return out


def _merge_lane_sums(members: list[Node], nodes: dict, users: dict, next_id: int, var: str,
                     where: str, tree: bool = False) -> tuple[list[Node], set[int], int]:
    """One group of `block_lane_sums`: (the nodes that replace it, the ids it drops, the next
    free id)."""
    sums = [nodes[m.inputs[0]] for m in members]
    vals = [nodes[s.inputs[0]] for s in sums]
    if any(len(users[s.id]) != 1 or len(users[v.id]) != 1 for s, v in zip(sums, vals)):
        raise DFGError(f"{where}: a lane sum or its input has other users")
    common = None
    if all(v.op is Op.MUL and v.lane is None for v in vals):
        shared = set(vals[0].inputs).intersection(*(v.inputs for v in vals[1:]))
        common = min(shared) if len(shared) == 1 else None
    terms = ([nodes[next(i for i in v.inputs if i != common)] for v in vals]
             if common is not None else vals)
    chain = all(t.op is Op.MUL and t.lane is None and len(users[t.id]) == 1 for t in terms)
    dropped = {m.id for m in members} | {s.id for s in sums}
    if common is not None:
        dropped |= {v.id for v in vals}
    new: list[Node] = []

    def add(op, inputs, name):
        nonlocal next_id
        new.append(Node(next_id, op, tuple(inputs), name=name))
        next_id += 1
        return new[-1]

    if tree and chain:
        # products in pairs (a mul and a mac), the pairs added as a tree: a few cycles from
        # the first load to the sum instead of two per product, so no operand waits long on
        # its PE; the common scalar once, after the lane sum
        dropped |= {t.id for t in terms}
        level = []
        for j in range(0, len(terms), 2):
            first = add(Op.MUL, terms[j].inputs, f"block {var}")
            level.append(first if j + 1 == len(terms) else
                         add(Op.MAC, (*terms[j + 1].inputs, first.id), f"block {var}"))
        while len(level) > 1:
            level = [add(Op.ADD, (level[j].id, level[j + 1].id), f"block {var}")
                     if j + 1 < len(level) else level[j] for j in range(0, len(level), 2)]
        out = add(Op.VSUM, (level[0].id,), sums[0].name)
        if common is not None:
            out = add(Op.MUL, (out.id, common), vals[0].name)
    elif chain and common is not None:
        # the common scalar scales each term's first operand as it arrives (its value is not
        # held in a register until the end of the chain), then the products chain
        dropped |= {t.id for t in terms}
        total = None
        for t in terms:
            scaled = add(Op.MUL, (t.inputs[0], common), vals[0].name)
            total = (add(Op.MUL, (scaled.id, t.inputs[1]), f"block {var}") if total is None
                     else add(Op.MAC, (scaled.id, t.inputs[1], total.id), f"block {var}"))
        out = add(Op.VSUM, (total.id,), sums[0].name)
    else:
        if chain:
            dropped |= {t.id for t in terms[1:]}
        total = terms[0]
        for t in terms[1:]:
            total = (add(Op.MAC, (*t.inputs, total.id), f"block {var}") if chain
                     else add(Op.ADD, (total.id, t.id), f"block {var}"))
        out = add(Op.VSUM, (total.id,), sums[0].name)
        if common is not None:
            out = add(Op.MUL, (out.id, common), vals[0].name)
    new.append(dataclasses.replace(members[0], inputs=(out.id,)))
    return new, dropped, next_id


def merged_body(nodes, emit: dict[int, list[Node]], dropped: set[int]) -> list[Node]:
    """`nodes` in order with each merged accumulation's last member replaced by its new nodes
    (`emit`) and the other members and their terms (`dropped`) left out."""
    body: list[Node] = []
    for n in nodes:
        if n.id in emit:
            body.extend(emit[n.id])
        elif n.id not in dropped:
            body.append(n)
    return body


def block_lane_sums(kernel: Kernel, var: str, factor: int, tree: bool = False) -> Kernel:
    """Register blocking of a lane-sum reduction (docs/conventions.md#sparse-line-model): loop
    `var` (dense, outside the vector loop) unrolled-and-jammed by `factor` (neighbouring
    iterations), then the `factor` copies of each `mul` -> [`mul` by a common scalar] ->
    `vsum` -> `acc` chain that accumulate at one address merged into one: the products chained
    through vector multiply-adds (`mac`, one per copy after the first), one lane sum, the
    common scalar (a mask value) multiplied once after it, one accumulation. So a block of
    `factor` vectors costs one lane sum and one register update instead of `factor` of each,
    as a GEMM's register block shares one load among its maccs. `tree`: the products in
    pairs (`mul`, `mac`) added as a tree, the common scalar after the lane sum -- a short
    path from each load to the sum (the held row of A, docs/conventions.md#held-loads). Sums
    in another order: fp32 tolerances."""
    where = f"kernel {kernel.name!r}: block_lane_sums({var!r}, {factor})"
    if var == kernel.vector_var:
        raise DFGError(f"{where}: blocks a loop outside the vector loop")
    k1 = unroll_and_jam(kernel, var, factor, inner=True)
    if factor == 1:
        return k1
    nodes = {n.id: n for n in k1.nodes}
    users = users_of(k1)
    groups: dict[tuple, list[Node]] = {}
    for n in k1.nodes:
        if n.op is Op.ACC and nodes[n.inputs[0]].op is Op.VSUM:
            groups.setdefault((n.buffer, str(n.addr)), []).append(n)
    # an accumulation's own register recurrence (a self edge) goes with it; any other
    # carried edge into the merged nodes is refused
    touched = {x for s, d, _ in k1.carried if s != d for x in (s, d)}
    dropped: set[int] = set()
    emit: dict[int, list[Node]] = {}  # last member's id -> the nodes that replace the group
    next_id = max(nodes) + 1
    for members in groups.values():
        if len(members) != factor:
            raise DFGError(f"{where}: {len(members)} accumulations at one address, not {factor}")
        new, gone, next_id = _merge_lane_sums(members, nodes, users, next_id, var, where,
                                              tree)
        dropped |= gone
        emit[members[-1].id] = new
    if dropped & touched:
        raise DFGError(f"{where}: a loop-carried edge touches a merged accumulation")
    body = merged_body(k1.nodes, emit, dropped)
    carried = tuple(e for e in k1.carried if e[0] not in dropped)
    out = _renumber(k1, body, carried)
    out.verify()
    return out


def devectorise_reduction(kernel: Kernel) -> Kernel:
    """The inverse of `vectorise_reduction`, for an array without a lane-sum unit: the vector
    loop becomes a scalar loop and each `vsum` goes, its accumulation taking the lanes one
    iteration each (docs/conventions.md#sparse-line-model). Needs every vector value to end in
    a `vsum` (no vector store, no vector accumulation)."""
    where = f"kernel {kernel.name!r}: devectorise_reduction"
    vv = kernel.vector_var
    if vv is None:
        raise DFGError(f"{where}: the kernel has no vector loop")
    vec = vector_nodes(kernel)
    sums = {n.id: n.inputs[0] for n in kernel.nodes if n.op is Op.VSUM}
    for n in kernel.nodes:
        if n.op is Op.VSUM:
            continue
        if n.id in vec and (n.op.writes_spm or n.addr is not None and n.addr.span):
            raise DFGError(f"{where}: node %{n.id} {n.op.value} writes or reads a vector row")
        if n.id not in vec and any(i in vec for i in n.inputs):
            raise DFGError(f"{where}: node %{n.id} takes a vector without a lane sum")
    nodes = [dataclasses.replace(n, inputs=tuple(sums.get(i, i) for i in n.inputs))
             for n in kernel.nodes if n.op is not Op.VSUM]
    out = _renumber(dataclasses.replace(kernel, vector_var=None), nodes, kernel.carried)
    out.verify()
    return out


def innermost_moving_loop(kernel: Kernel, lanes: int = 1) -> str | None:
    """The innermost loop that takes more than one step: a dense loop of extent 1, and the
    vector loop when it is one vector of `lanes`, never move; a sparse loop may."""
    for lp in reversed(kernel.loops):
        steps = lp.extent if lp.is_dense else 2
        if lp.var == kernel.vector_var:
            steps = -(-lp.extent // max(1, lanes))
        if steps > 1:
            return lp.var
    return None


def hold_invariant_loads(kernel: Kernel, lanes: int = 1) -> Kernel:
    """Every `load` whose address does not use the innermost moving loop
    (`innermost_moving_loop`) marked `hold`: its PE keeps the value it loaded and reads the
    SPM again only when its address changes from the copy's previous iteration (an SDDMM's
    row of A, invariant over the nonzeros of its row, docs/conventions.md#held-loads). The
    values are the same; only SPM reads go. A kernel with nothing to hold comes back as it
    is."""
    var = innermost_moving_loop(kernel, lanes)
    if var is None:
        return kernel
    held = {n.id for n in kernel.nodes
            if n.op is Op.LOAD and not n.hold and not n.addr.coef(var)}
    if not held:
        return kernel
    nodes = tuple(dataclasses.replace(n, hold=True) if n.id in held else n
                  for n in kernel.nodes)
    out = dataclasses.replace(kernel, nodes=nodes)
    out.verify()
    return out


def _row_max_of(a: Kernel, b: Kernel, lanes: int) -> Kernel | None:
    """`a` computing `b`'s row maximum too (`fuse_row_max`), or None where it cannot."""
    if len(b.loops) != 2 or len(a.loops) < 2 or b.vector_var is not None:
        return None
    (ri, rp), (ai, ap) = b.loops, a.loops[:2]
    if not (ri.is_dense and ai.is_dense and ri.extent == ai.extent and not rp.is_dense
            and not ap.is_dense and np.array_equal(b.domain[rp.pos], a.domain[ap.pos])):
        return None
    if [n.op for n in b.nodes] != [Op.LOAD, Op.ACC_MAX] or b.carried != ((1, 1, 1),):
        return None
    load, amax = b.nodes
    if load.addr != Addr(((rp.var, 1),)) or amax.addr != Addr(((ri.var, 1),)):
        return None
    # every loop inside a's sparse loop takes one step: its write at the position is a whole
    # value, not a partial sum
    for lp in a.loops[2:]:
        steps = -(-lp.extent // lanes) if lp.var == a.vector_var else lp.extent
        if not lp.is_dense or steps != 1:
            return None
    writers = [n for n in a.nodes if n.buffer == load.buffer and n.op.writes_spm]
    if len(writers) != 1 or writers[0].op not in (Op.ACC, Op.STORE) \
            or writers[0].addr != Addr(((ap.var, 1),)) or writers[0].inputs[-1] in vector_nodes(a):
        return None
    if a.buffer_map[load.buffer].init != 0.0 or amax.buffer in a.buffer_map:
        return None
    nid = len(a.nodes)
    node = dataclasses.replace(amax, id=nid, inputs=(writers[0].inputs[-1],),
                               addr=Addr(((ai.var, 1),)))
    out = dataclasses.replace(a, nodes=(*a.nodes, node),
                              buffers=(*a.buffers, b.buffer_map[amax.buffer]),
                              carried=(*a.carried, (nid, nid, 1)))
    out.verify()
    return out


def fuse_row_max(program: Program, lanes: int) -> Program:
    """Each row-maximum kernel (a load of S at the position and an `accmax` into the row's
    word, the attention's `softmax_max`) folded into the kernel before it when that kernel
    writes S whole at the position over the same rows and positions (every loop inside its
    sparse loop one step, the vector loop one vector of `lanes`: the held-row SDDMM): its
    `accmax` then takes the value it writes, so the program loses a kernel and a pass over S
    (docs/conventions.md#attention-fold). S starts at zero, so the value written is the one
    the maximum read back: the same maximum. The program as it is where nothing folds."""
    kernels, out, changed = list(program.kernels), [], False
    j = 0
    while j < len(kernels):
        fused = _row_max_of(kernels[j], kernels[j + 1], lanes) if j + 1 < len(kernels) else None
        out.append(fused or kernels[j])
        changed |= fused is not None
        j += 2 if fused is not None else 1
    if not changed:
        return program
    prog = dataclasses.replace(program, kernels=tuple(out))
    prog.verify()
    return prog
